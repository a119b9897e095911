/* Weight-only int4 and int8 matrix-vector products for one row of bfloat16
 * activations, with AVX512-BF16: y[o] = sum_i x[i] * w[o, i].
 *
 * A decode step at batch 1 streams every weight once for one row of activations, so
 * it runs at memory speed or not at all: 32 weights become 32 bfloat16s in three
 * instructions (zero-extend, mask or shift, one table lookup) and meet the
 * activations in one vdpbf16ps; four output rows run side by side so the float adds
 * do not wait on each other; the rows ahead are prefetched. On the default model's
 * int4 weights (benchmarks/runner_ab.py --quantization int4) whole batch-1 decode
 * steps are faster than with torch's _weight_int4pack_mm_for_cpu; at 2 and 4 rows a
 * kernel like this one was no faster than torch's, so those stay with torch.
 *
 * The weight is quantized in groups of 32 inputs: w = (q - 8) * scale + offset with
 * q in 0..15 and scale, offset bfloat16 (the values `Int4Weight.quantize` makes).
 * Each output row o is stored as `in / 2 + 4 * (in / 32)` bytes:
 *   nibbles  in / 2 bytes; for each 64 inputs starting at 64p, byte 32p + j holds
 *            q[64p + j] in its low nibble and q[64p + 32 + j] in its high one
 *   scales   in / 32 bfloat16s, one per group
 *   offsets  in / 32 bfloat16s
 * Sums are float32: group g adds scale * (sum of (q - 8) * x over the group, exact
 * products) + offset * (sum of x over the group); y is rounded to bfloat16 once.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX512BF16__
#include <immintrin.h>
#endif

#include "bf16_math.h"
#include "thread_rows.h"

/* Output rows side by side, and how far ahead (in rows) to prefetch. */
#define ROWS_TOGETHER 4
#define PREFETCH_ROWS 16

int quantized_matvec_available(void) {
#ifdef __AVX512BF16__
    return 1;
#else
    return 0;
#endif
}

/* Prefetch the ROWS_TOGETHER rows (`stride` bytes each) PREFETCH_ROWS after row o,
 * when they are still this thread's (below `end`). ROWS_TOGETHER rows are read as
 * that many short interleaved streams, which the hardware prefetcher does not
 * follow: without this, cold int4 weights streamed well below torch's speed.
 * Forced inline: gcc 12 left it a call, and the int8 head became markedly slower. */
static inline __attribute__((always_inline)) void prefetch_ahead(const uint8_t *w, int64_t o,
                                                                 int64_t end, int64_t stride) {
    if (o + PREFETCH_ROWS + ROWS_TOGETHER > end) return;
    const uint8_t *ahead = w + (o + PREFETCH_ROWS) * stride;
    for (int64_t b = 0; b < ROWS_TOGETHER * stride; b += 64) __builtin_prefetch(ahead + b);
}

#ifdef __AVX512BF16__
/* Output rows o .. o + n - 1 (n = ROWS_TOGETHER, or 1 for the tail; a compile-time
 * constant at each call). `sums` holds x's group sums; `w` points at row o. */
static inline __attribute__((always_inline)) void int4_rows(const uint16_t *x,
                                                            const float *sums, int64_t in,
                                                            const uint8_t *w, int64_t stride,
                                                            uint16_t *y, const int n) {
    const int64_t groups = in / 32;
    /* bfloat16 of q - 8 for q = 0..15 (the upper 16 entries are never indexed). */
    const __m512i table = _mm512_set_epi16(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x40e0, 0x40c0, 0x40a0, 0x4080, 0x4040,
        0x4000, 0x3f80, 0x0000, (short)0xbf80, (short)0xc000, (short)0xc040, (short)0xc080,
        (short)0xc0a0, (short)0xc0c0, (short)0xc0e0, (short)0xc100);
    const __m512i low4 = _mm512_set1_epi16(0x0f);
    /* Two accumulators per row: one chain per row was bound by FMA latency. */
    __m512 acc[ROWS_TOGETHER][2];
    for (int r = 0; r < n; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t p = 0; p < groups / 2; ++p) {
        const __m512bh x0 = (__m512bh)_mm512_loadu_si512(x + 64 * p);
        const __m512bh x1 = (__m512bh)_mm512_loadu_si512(x + 64 * p + 32);
        for (int r = 0; r < n; ++r) {
            const uint8_t *row = w + r * stride;
            const uint16_t *scales = (const uint16_t *)(row + in / 2);
            const __m512i bytes =
                _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(row + 32 * p)));
            const __m512bh first =
                (__m512bh)_mm512_permutexvar_epi16(_mm512_and_si512(bytes, low4), table);
            const __m512bh second =
                (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(bytes, 4), table);
            acc[r][0] = _mm512_fmadd_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), first, x0),
                                        _mm512_set1_ps(bf16_to_float(scales[2 * p])), acc[r][0]);
            acc[r][1] =
                _mm512_fmadd_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), second, x1),
                                _mm512_set1_ps(bf16_to_float(scales[2 * p + 1])), acc[r][1]);
        }
    }
    for (int r = 0; r < n; ++r) {
        const uint16_t *offsets = (const uint16_t *)(w + r * stride + in / 2) + groups;
        /* The offsets times each group's activation sum, 16 groups at a time. */
        for (int64_t g = 0; g < groups; g += 16) {
            const __mmask16 live =
                groups - g >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (groups - g)) - 1);
            const __m512 off = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(live, offsets + g)), 16));
            acc[r][0] = _mm512_fmadd_ps(off, _mm512_maskz_loadu_ps(live, sums + g), acc[r][0]);
        }
        y[r] = float_to_bf16(_mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1])));
    }
}
#endif

/* Returns 0, or 1 when this build or these shapes are not served (no AVX512-BF16,
 * `in` not a positive multiple of 64), or 2 when scratch memory could not be
 * allocated. `w` is `out` rows laid out as above. */
int int4_matvec_bf16(const uint16_t *x, int64_t in, const uint8_t *w, int64_t out, uint16_t *y,
                     int num_threads) {
#ifndef __AVX512BF16__
    (void)x, (void)in, (void)w, (void)out, (void)y, (void)num_threads;
    return 1;
#else
    if (in % 64 || in < 64) return 1;
    const int64_t groups = in / 32, stride = in / 2 + 4 * groups;
    float *sums = malloc(sizeof(float) * (size_t)groups);
    if (sums == NULL) return 2;
    for (int64_t g = 0; g < groups; ++g) {
        float s = 0.0f;
        for (int64_t i = 0; i < 32; ++i) s += bf16_to_float(x[32 * g + i]);
        sums[g] = s;
    }
#pragma omp parallel num_threads(num_threads)
    {
        int64_t o, end;
        thread_rows(out, &o, &end);
        for (; o + ROWS_TOGETHER <= end; o += ROWS_TOGETHER) {
            prefetch_ahead(w, o, end, stride);
            int4_rows(x, sums, in, w + o * stride, stride, y + o, ROWS_TOGETHER);
        }
        for (; o < end; ++o) int4_rows(x, sums, in, w + o * stride, stride, y + o, 1);
    }
    free(sums);
    return 0;
#endif
}

/* int8, one scale per output row (`Int8Weight`): w[o, i] = q[o, i] * scale[o], q a
 * plain row-major int8 [out, in] matrix (torch's _weight_int8pack_mm reads the same
 * one, so nothing is stored twice). A byte q = 16 * h + l with l = q & 15 and h its
 * signed upper nibble, so the same one-lookup nibble-to-bfloat16 conversion serves:
 * y[o] = scale[o] * (16 * sum h * x + sum l * x), products exact in float32. */
#ifdef __AVX512BF16__
static inline __attribute__((always_inline)) void int8_rows(const uint16_t *x, int64_t in,
                                                            const int8_t *q,
                                                            const uint16_t *scales, uint16_t *y,
                                                            const int n) {
    /* bfloat16 of l for l = 0..15, and of the signed upper nibble (0..7, then -8..-1). */
    const __m512i low_table = _mm512_set_epi16(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x4170, 0x4160, 0x4150, 0x4140, 0x4130,
        0x4120, 0x4110, 0x4100, 0x40e0, 0x40c0, 0x40a0, 0x4080, 0x4040, 0x4000, 0x3f80, 0x0000);
    const __m512i high_table = _mm512_set_epi16(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, (short)0xbf80, (short)0xc000,
        (short)0xc040, (short)0xc080, (short)0xc0a0, (short)0xc0c0, (short)0xc0e0, (short)0xc100,
        0x40e0, 0x40c0, 0x40a0, 0x4080, 0x4040, 0x4000, 0x3f80, 0x0000);
    const __m512i low4 = _mm512_set1_epi16(0x0f);
    __m512 high[ROWS_TOGETHER], low[ROWS_TOGETHER];
    for (int r = 0; r < n; ++r) high[r] = low[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < in; i += 32) {
        const __m512bh xs = (__m512bh)_mm512_loadu_si512(x + i);
        for (int r = 0; r < n; ++r) {
            const __m512i bytes =
                _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(q + r * in + i)));
            low[r] = _mm512_dpbf16_ps(
                low[r], (__m512bh)_mm512_permutexvar_epi16(_mm512_and_si512(bytes, low4), low_table),
                xs);
            high[r] = _mm512_dpbf16_ps(
                high[r], (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(bytes, 4), high_table),
                xs);
        }
    }
    for (int r = 0; r < n; ++r) {
        const float dot = 16.0f * _mm512_reduce_add_ps(high[r]) + _mm512_reduce_add_ps(low[r]);
        y[r] = float_to_bf16(dot * bf16_to_float(scales[r]));
    }
}
#endif

/* Returns 0, or 1 when this build or these shapes are not served (no AVX512-BF16,
 * `in` not a positive multiple of 32). `q` is [out, in], `scales` [out] bfloat16. */
int int8_matvec_bf16(const uint16_t *x, int64_t in, const int8_t *q, const uint16_t *scales,
                     int64_t out, uint16_t *y, int num_threads) {
#ifndef __AVX512BF16__
    (void)x, (void)in, (void)q, (void)scales, (void)out, (void)y, (void)num_threads;
    return 1;
#else
    if (in % 32 || in < 32) return 1;
#pragma omp parallel num_threads(num_threads)
    {
        int64_t o, end;
        thread_rows(out, &o, &end);
        for (; o + ROWS_TOGETHER <= end; o += ROWS_TOGETHER) {
            prefetch_ahead((const uint8_t *)q, o, end, in);
            int8_rows(x, in, q + o * in, scales + o, y + o, ROWS_TOGETHER);
        }
        for (; o < end; ++o) int8_rows(x, in, q + o * in, scales + o, y + o, 1);
    }
    return 0;
#endif
}
