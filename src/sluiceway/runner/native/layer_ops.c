/* The elementwise parts of a decoder layer in bfloat16, each one pass instead of the
 * several torch ops (and temporaries) they replace:
 *   rms_norm_bf16      out = x / rms(x) * weight
 *   add_rms_norm_bf16  residual += delta (rounded to bfloat16, as torch's add does),
 *                      then out = rms_norm(residual)
 *   silu_mul_bf16      out = silu(gate) * up for gate_up = [gate | up] per row
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
