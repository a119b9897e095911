/* The elementwise parts of a decoder layer in bfloat16, each one pass instead of the
 * several torch ops (and temporaries) they replace:
 *   rms_norm_bf16      out = x / rms(x) * weight
 *   add_rms_norm_bf16  residual += delta (rounded to bfloat16, as torch's add does),
 *                      then out = rms_norm(residual)
 *   silu_mul_bf16      out = silu(gate) * up for gate_up = [gate | up] per row
 *   rope_cache_bf16    rotary embedding of q and k in a fused qkv row, with the
 *                      rotated k and the v stored in the paged KV cache
 * Arithmetic is float32 and each output is rounded to bfloat16 once. Rows run in
 * parallel on torch's OpenMP pool when there are enough of them to pay for it.
 * Tensors are contiguous [rows, dim] bfloat16 passed as uint16_t bit patterns.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16_math.h"

/* Below this many elements a call stays on the calling thread (a parallel region
 * costs microseconds; a 576-wide row takes well under one). */
#define PARALLEL_MIN_ELEMENTS 16384

static inline void norm_row(const uint16_t *x, const uint16_t *weight, uint16_t *out,
                            int64_t dim, float eps) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t d = 0; d < dim; ++d) {
        const float v = bf16_to_float(x[d]);
        sum += v * v;
    }
    const float inv = 1.0f / sqrtf(sum / (float)dim + eps);
#pragma omp simd
    for (int64_t d = 0; d < dim; ++d)
        out[d] = float_to_bf16(bf16_to_float(x[d]) * inv * bf16_to_float(weight[d]));
}

void rms_norm_bf16(const uint16_t *x, const uint16_t *weight, uint16_t *out, int64_t rows,
                   int64_t dim, float eps, int num_threads) {
    const int threads = rows * dim >= PARALLEL_MIN_ELEMENTS ? num_threads : 1;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t r = 0; r < rows; ++r)
        norm_row(x + r * dim, weight, out + r * dim, dim, eps);
}

void add_rms_norm_bf16(uint16_t *residual, const uint16_t *delta, const uint16_t *weight,
                       uint16_t *out, int64_t rows, int64_t dim, float eps, int num_threads) {
    const int threads = rows * dim >= PARALLEL_MIN_ELEMENTS ? num_threads : 1;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t r = 0; r < rows; ++r) {
        uint16_t *h = residual + r * dim;
        const uint16_t *d = delta + r * dim;
#pragma omp simd
        for (int64_t i = 0; i < dim; ++i)
            h[i] = float_to_bf16(bf16_to_float(h[i]) + bf16_to_float(d[i]));
        norm_row(h, weight, out + r * dim, dim, eps);
    }
}

void silu_mul_bf16(const uint16_t *gate_up, uint16_t *out, int64_t rows, int64_t dim,
                   int num_threads) {
    const int threads = rows * dim >= PARALLEL_MIN_ELEMENTS ? num_threads : 1;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t r = 0; r < rows; ++r) {
        const uint16_t *__restrict gate = gate_up + r * 2 * dim;
        const uint16_t *__restrict up = gate + dim;
        uint16_t *__restrict dst = out + r * dim;
#pragma omp simd
        for (int64_t i = 0; i < dim; ++i) {
            const float g = bf16_to_float(gate[i]);
            /* sigmoid(g) = num / (1 + e) with e = exp(-|g|), which never overflows. */
            const float e = exp_nonpositive(-fabsf(g));
            const float num = g >= 0.0f ? 1.0f : e;
            dst[i] = float_to_bf16(g * bf16_to_float(up[i]) * num / (1.0f + e));
        }
    }
}

/* Rotate-half RoPE of one head: dst[d] = x[d] * cos[d] + x[d +- half] * signed_sin[d],
 * each product and the sum rounded to bfloat16 like torch's three bfloat16 ops
 * (a product of two bfloat16s is exact in float32, so this matches bit for bit).
 * `dst` may be `x`: the head is read whole before it is written. */
static inline void rope_head(const uint16_t *x, const uint16_t *cos, const uint16_t *sin,
                             uint16_t *dst, int64_t head_dim) {
    uint16_t rotated[256];
    const int64_t half = head_dim / 2;
#pragma omp simd
    for (int64_t d = 0; d < head_dim; ++d) {
        const float a = bf16_to_float(float_to_bf16(bf16_to_float(x[d]) * bf16_to_float(cos[d])));
        const uint16_t partner = x[d < half ? d + half : d - half];
        const float b =
            bf16_to_float(float_to_bf16(bf16_to_float(partner) * bf16_to_float(sin[d])));
        rotated[d] = float_to_bf16(a + b);
    }
    memcpy(dst, rotated, sizeof(uint16_t) * (size_t)head_dim);
}

/* For each row of `qkv` ([rows, (H + 2 * KVH) * D]: q heads, k heads, v heads):
 * q_out[row] = rope(q), k = rope(k) in place in qkv, then the row's k and v are
 * stored at cache slot `slots[row]` of both caches ([num_slots, KVH, D]). `cos` and
 * `sin` are [rows, D] (sin with its first half negated). Returns 0, 1 for a head_dim
 * over 256 or odd, or 2 if a slot is outside 0 .. num_slots - 1 (then nothing is
 * written). */
int rope_cache_bf16(uint16_t *qkv, const uint16_t *cos, const uint16_t *sin,
                    const int64_t *slots, uint16_t *q_out, uint16_t *k_cache, uint16_t *v_cache,
                    int64_t rows, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                    int64_t num_slots, int num_threads) {
    if (head_dim > 256 || head_dim % 2) return 1;
    for (int64_t r = 0; r < rows; ++r)
        if (slots[r] < 0 || slots[r] >= num_slots) return 2;
    const int64_t width = (num_heads + 2 * num_kv_heads) * head_dim;
    const int64_t kv_width = num_kv_heads * head_dim;
    const int threads = rows * width >= PARALLEL_MIN_ELEMENTS ? num_threads : 1;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t r = 0; r < rows; ++r) {
        uint16_t *row = qkv + r * width;
        const uint16_t *c = cos + r * head_dim, *s = sin + r * head_dim;
        for (int64_t h = 0; h < num_heads; ++h)
            rope_head(row + h * head_dim, c, s, q_out + (r * num_heads + h) * head_dim, head_dim);
        uint16_t *k = row + num_heads * head_dim;
        for (int64_t h = 0; h < num_kv_heads; ++h)
            rope_head(k + h * head_dim, c, s, k + h * head_dim, head_dim);
        memcpy(k_cache + slots[r] * kv_width, k, sizeof(uint16_t) * (size_t)kv_width);
        memcpy(v_cache + slots[r] * kv_width, k + kv_width, sizeof(uint16_t) * (size_t)kv_width);
    }
    return 0;
}
