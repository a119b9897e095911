/* bfloat16 <-> float32 and a vectorizable exp, shared by the native kernels. */
#ifndef SLUICEWAY_BF16_MATH_H
#define SLUICEWAY_BF16_MATH_H

#include <stdint.h>
#include <string.h>

static inline float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Round to nearest even, as torch's float -> bfloat16 conversion does (NaN stays NaN). */
static inline uint16_t float_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* exp(x) for x <= 0 (scores minus their maximum), vectorizable: 2^n * p(f) with a
 * degree-6 polynomial for 2^f on [-0.5, 0.5]; relative error about 2e-7. Inputs
 * below -87 give 0. */
#pragma omp declare simd
static inline float exp_nonpositive(float x) {
    if (x < -87.0f) return 0.0f;
    float t = x * 1.44269504088896341f;
    float n = __builtin_rintf(t); /* nearest, vectorizes (roundf does not) */
    float f = t - n;
    float p = 1.535336188319500e-4f;
    p = p * f + 1.339887440266574e-3f;
    p = p * f + 9.618437357674640e-3f;
    p = p * f + 5.550332471162809e-2f;
    p = p * f + 2.402264791363012e-1f;
    p = p * f + 6.931472028550421e-1f;
    p = p * f + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &e, sizeof scale);
    return p * scale;
}

#endif
