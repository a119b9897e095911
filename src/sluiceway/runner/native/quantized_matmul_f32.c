/* Weight-only int4 and int8 products for rows of float32 activations, with AVX2 and
 * FMA: y[r, o] = sum_i x[r, i] * w[o, i] for r < m.
 *
 * This is the float32 counterpart of quantized_matvec.c, for CPUs without
 * AVX512-BF16 (or models served in float32). A decode step at a few rows streams
 * every weight once, so it is bound by the weight bytes: int4 reads an eighth of
 * float32's and int8 a quarter. Each weight row is read from memory once for all m
 * activation rows; it is converted to floats once per MAX_ROWS of them and meets
 * them while it sits in registers, so the conversion is paid once per step and
 * pass, not once per sequence. The products are the float32 products of
 * the activations with the quantized weight values, summed in another order than a
 * dense matmul of the dequantized weight (the two agree to float32 rounding).
 *
 * int4 groups of 32 inputs: w = q * scale + bias, q in 0..15, scale and bias float32
 * (`bias` is `offset - 8 * scale` of `Int4Weight`'s (q - 8) * scale + offset). Each
 * output row o is stored as `in / 2 + 8 * (in / 32)` bytes:
 *   nibbles  in / 2 bytes; for each 64 inputs starting at 64p, byte 32p + j holds
 *            q[64p + j] in its low nibble and q[64p + 32 + j] in its high one
 *            (quantized_matvec.c's order, so `pack_int4` serves both)
 *   scales   in / 32 float32s, one per group
 *   biases   in / 32 float32s
 * Group g of row r adds scale * (sum over the group of q * x) + bias * (sum of x).
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "thread_rows.h"
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HAVE_KERNELS 1
#else
#define HAVE_KERNELS 0
#endif

/* Activation rows per pass over a weight row: their accumulators, four converted
 * weight vectors and temporaries fit AVX2's sixteen registers. */
#define MAX_ROWS 8

int quantized_matmul_f32_available(void) { return HAVE_KERNELS; }

#if HAVE_KERNELS
static inline __attribute__((always_inline)) float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 unsigned bytes (the low 8 of `b`) as 8 floats. */
static inline __attribute__((always_inline)) __m256 u8_to_ps(__m128i b) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
}

/* One weight row against m activation rows (m a compile-time constant at each call).
 * `x` is [m, in], `sums` [m, in / 32] the activations' group sums, `w` the packed
 * row; writes y[r * out] for r < m. */
static inline __attribute__((always_inline)) void int4_row(const float *x, const float *sums,
                                                           int64_t in, const uint8_t *w,
                                                           float *y, int64_t out, const int m) {
    const int64_t groups = in / 32;
    const float *scales = (const float *)(w + in / 2), *biases = scales + groups;
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    __m256 acc[MAX_ROWS];
    for (int r = 0; r < m; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t p = 0; p < groups / 2; ++p) {
        const __m256i bytes = _mm256_loadu_si256((const __m256i *)(w + 32 * p));
        for (int half = 0; half < 2; ++half) {
            /* q of inputs 64p + 32 * half + 0..31 */
            const __m256i q = half ? _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4)
                                   : _mm256_and_si256(bytes, low4);
            const __m128i q0 = _mm256_castsi256_si128(q), q1 = _mm256_extracti128_si256(q, 1);
            const __m256 f0 = u8_to_ps(q0), f1 = u8_to_ps(_mm_srli_si128(q0, 8));
            const __m256 f2 = u8_to_ps(q1), f3 = u8_to_ps(_mm_srli_si128(q1, 8));
            const int64_t base = 64 * p + 32 * half;
            const __m256 scale = _mm256_set1_ps(scales[2 * p + half]);
            for (int r = 0; r < m; ++r) {
                const float *xr = x + r * in + base;
                __m256 dot = _mm256_mul_ps(f0, _mm256_loadu_ps(xr));
                dot = _mm256_fmadd_ps(f1, _mm256_loadu_ps(xr + 8), dot);
                dot = _mm256_fmadd_ps(f2, _mm256_loadu_ps(xr + 16), dot);
                dot = _mm256_fmadd_ps(f3, _mm256_loadu_ps(xr + 24), dot);
                acc[r] = _mm256_fmadd_ps(dot, scale, acc[r]);
            }
        }
    }
    for (int r = 0; r < m; ++r) {
        /* The biases times each group's activation sum, 8 groups at a time (groups
         * is even, in is a multiple of 64, so the tail is a multiple of 2 below 8). */
        const float *sr = sums + r * groups;
        int64_t g = 0;
        for (; g + 8 <= groups; g += 8)
            acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(biases + g), _mm256_loadu_ps(sr + g), acc[r]);
        float tail = 0.0f;
        for (; g < groups; ++g) tail += biases[g] * sr[g];
        y[r * out] = hsum(acc[r]) + tail;
    }
}

/* The same for int8 with one scale per output row: y = scale * sum q * x, 16 inputs
 * at a time (`in` a multiple of 32). Two accumulators per activation row: with one,
 * a single row's FMAs wait on each other. */
static inline __attribute__((always_inline)) void int8_row(const float *x, int64_t in,
                                                           const int8_t *q, float scale,
                                                           float *y, int64_t out, const int m) {
    __m256 acc[MAX_ROWS][2];
    for (int r = 0; r < m; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t i = 0; i < in; i += 16) {
        const __m128i bytes = _mm_loadu_si128((const __m128i *)(q + i));
        const __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
        const __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(bytes, 8)));
        for (int r = 0; r < m; ++r) {
            const float *xr = x + r * in + i;
            acc[r][0] = _mm256_fmadd_ps(f0, _mm256_loadu_ps(xr), acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(f1, _mm256_loadu_ps(xr + 8), acc[r][1]);
        }
    }
    for (int r = 0; r < m; ++r) y[r * out] = scale * hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
}

/* Dispatch on the row count n (1..MAX_ROWS) so each call site sees a constant and
 * unrolls. */
#define FOR_EACH_COUNT(n, call)                                                               \
    switch (n) {                                                                              \
        case 1: call(1); break;                                                               \
        case 2: call(2); break;                                                               \
        case 3: call(3); break;                                                               \
        case 4: call(4); break;                                                               \
        case 5: call(5); break;                                                               \
        case 6: call(6); break;                                                               \
        case 7: call(7); break;                                                               \
        default: call(8); break;                                                              \
    }
#endif

/* Returns 0; 1 when this build or these shapes are not served (no AVX2 and FMA,
 * m < 1, `in` not a positive multiple of 64); 2 when scratch memory
 * could not be allocated. `x` is [m, in], `w` `out` rows laid out as above, `y`
 * [m, out]. */
int int4_matmul_f32(const float *x, int64_t m, int64_t in, const uint8_t *w, int64_t out,
                    float *y, int num_threads) {
#if !HAVE_KERNELS
    (void)x, (void)m, (void)in, (void)w, (void)out, (void)y, (void)num_threads;
    return 1;
#else
    if (m < 1 || in % 64 || in < 64) return 1;
    const int64_t groups = in / 32, stride = in / 2 + 8 * groups;
    float *sums = malloc(sizeof(float) * (size_t)(m * groups));
    if (sums == NULL) return 2;
    for (int64_t r = 0; r < m; ++r)
        for (int64_t g = 0; g < groups; ++g) {
            float s = 0.0f;
            for (int64_t i = 0; i < 32; ++i) s += x[r * in + 32 * g + i];
            sums[r * groups + g] = s;
        }
#pragma omp parallel num_threads(num_threads)
    {
        int64_t o, end;
        thread_rows(out, &o, &end);
        for (; o < end; ++o) {
            const uint8_t *row = w + o * stride; /* read once from memory, then from L1 */
            for (int64_t c = 0; c < m; c += MAX_ROWS) {
                const int64_t n = m - c < MAX_ROWS ? m - c : MAX_ROWS;
#define INT4_ROW(M) int4_row(x + c * in, sums + c * groups, in, row, y + c * out + o, out, M)
                FOR_EACH_COUNT(n, INT4_ROW)
#undef INT4_ROW
            }
        }
    }
    free(sums);
    return 0;
#endif
}

/* Returns 0, or 1 when this build or these shapes are not served (no AVX2 and FMA,
 * m < 1, `in` not a positive multiple of 32). `q` is [out, in] int8,
 * `scales` [out] float32, `x` [m, in], `y` [m, out]. */
int int8_matmul_f32(const float *x, int64_t m, int64_t in, const int8_t *q,
                    const float *scales, int64_t out, float *y, int num_threads) {
#if !HAVE_KERNELS
    (void)x, (void)m, (void)in, (void)q, (void)scales, (void)out, (void)y, (void)num_threads;
    return 1;
#else
    if (m < 1 || in % 32 || in < 32) return 1;
#pragma omp parallel num_threads(num_threads)
    {
        int64_t o, end;
        thread_rows(out, &o, &end);
        for (; o < end; ++o) {
            const int8_t *row = q + o * in; /* read once from memory, then from L1 */
            for (int64_t c = 0; c < m; c += MAX_ROWS) {
                const int64_t n = m - c < MAX_ROWS ? m - c : MAX_ROWS;
#define INT8_ROW(M) int8_row(x + c * in, in, row, scales[o], y + c * out + o, out, M)
                FOR_EACH_COUNT(n, INT8_ROW)
#undef INT8_ROW
            }
        }
    }
    return 0;
#endif
}
