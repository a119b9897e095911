/* GGUF Q6_K blocks as float32 values, on every thread.
 *
 * A Q4_K_M file stores its output head and about half of its layers' attn_v and
 * ffn_down in Q6_K: in a Llama-3.1-8B shape 1.5 G weights, which gguf-py's numpy
 * decoder takes about 10 s of a start to turn into floats (157 M weights a
 * second on one core). The arithmetic here is gguf-py's (and ggml's reference),
 * operation for operation in float32, so the values are the same bit for bit:
 *
 *   block of 256 weights, 210 bytes: ql[128] (low 4 bits), qh[64] (high 2
 *   bits), scales[16] (int8, one per 16 weights), d (float16)
 *   w = (d * scale) * (q - 32), q = low | high << 4 in 0..63
 *
 * Weight j of the block (half h = j / 128, l = j % 32, quarter s = (j % 128) / 32)
 * takes its low nibble from ql[64 h + l + 32 (s & 1)] (low nibble for s < 2, high
 * otherwise), its high bits from qh[32 h + l] >> 2 s, and scale 8 h + l / 16 + 2 s.
 */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "half_math.h"

#define Q6_K_BYTES 210

static void q6_k_block(const uint8_t *block, float *y) {
    const uint8_t *ql = block, *qh = block + 128;
    const int8_t *scales = (const int8_t *)(block + 192);
    uint16_t h;
    memcpy(&h, block + 208, 2);
    const float d = half_to_float(h);
    float ds[16];
    for (int i = 0; i < 16; ++i) ds[i] = d * (float)scales[i];
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32, y += 128) {
        const float *sc = ds + 8 * half;
        for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            const int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = sc[is] * (float)q1;
            y[l + 32] = sc[is + 2] * (float)q2;
            y[l + 64] = sc[is + 4] * (float)q3;
            y[l + 96] = sc[is + 6] * (float)q4;
        }
    }
}

/* `n_blocks` Q6_K blocks at `blocks` as 256 float32 values each at `out`. */
void block_values_q6_k(const uint8_t *blocks, int64_t n_blocks, float *out, int num_threads) {
#pragma omp parallel for num_threads(num_threads) schedule(static) if (n_blocks > 64)
    for (int64_t b = 0; b < n_blocks; ++b) q6_k_block(blocks + b * Q6_K_BYTES, out + b * 256);
}
