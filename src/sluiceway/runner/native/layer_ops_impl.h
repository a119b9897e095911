/* The kernels of layer_ops.c over one element type, included once per type.
 * Before including, define:
 *   T         the element type (uint16_t holding bfloat16 bits, or float)
 *   LOAD(v)   an element as float
 *   STORE(f)  a float rounded to an element
 *   ROUND(f)  a float rounded to the element type and back (what storing and
 *             reloading it gives)
 *   NAME(op)  the name of `op` for this type
 * No include guard: it is meant to be included more than once; it undefines its
 * parameters at its end.
 */

/* Below this many elements a call stays on the calling thread (a parallel region
 * costs microseconds; a 576-wide row takes well under one). */
#ifndef PARALLEL_MIN_ELEMENTS
#define PARALLEL_MIN_ELEMENTS 16384
#endif

static inline void NAME(norm_row)(const T *x, const T *weight, T *out,
                            int64_t dim, float eps) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t d = 0; d < dim; ++d) {
        const float v = LOAD(x[d]);
        sum += v * v;
    }
    const float inv = 1.0f / sqrtf(sum / (float)dim + eps);
#pragma omp simd
    for (int64_t d = 0; d < dim; ++d)
        out[d] = STORE(LOAD(x[d]) * inv * LOAD(weight[d]));
}

void NAME(rms_norm)(const T *x, const T *weight, T *out, int64_t rows,
                   int64_t dim, float eps, int num_threads) {
    const int threads = rows * dim >= PARALLEL_MIN_ELEMENTS ? num_threads : 1;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t r = 0; r < rows; ++r)
        NAME(norm_row)(x + r * dim, weight, out + r * dim, dim, eps);
}

void NAME(add_rms_norm)(T *residual, const T *delta, const T *weight,
                       T *out, int64_t rows, int64_t dim, float eps, int num_threads) {
    const int threads = rows * dim >= PARALLEL_MIN_ELEMENTS ? num_threads : 1;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t r = 0; r < rows; ++r) {
        T *h = residual + r * dim;
        const T *d = delta + r * dim;
#pragma omp simd
        for (int64_t i = 0; i < dim; ++i)
            h[i] = STORE(LOAD(h[i]) + LOAD(d[i]));
        NAME(norm_row)(h, weight, out + r * dim, dim, eps);
    }
}

void NAME(silu_mul)(const T *gate_up, T *out, int64_t rows, int64_t dim,
                   int num_threads) {
    const int threads = rows * dim >= PARALLEL_MIN_ELEMENTS ? num_threads : 1;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t r = 0; r < rows; ++r) {
        const T *__restrict gate = gate_up + r * 2 * dim;
        const T *__restrict up = gate + dim;
        T *__restrict dst = out + r * dim;
#pragma omp simd
        for (int64_t i = 0; i < dim; ++i) {
            const float g = LOAD(gate[i]);
            /* sigmoid(g) = num / (1 + e) with e = exp(-|g|), which never overflows. */
            const float e = exp_nonpositive(-fabsf(g));
            const float num = g >= 0.0f ? 1.0f : e;
            dst[i] = STORE(g * LOAD(up[i]) * num / (1.0f + e));
        }
    }
}

/* Rotate-half RoPE of one head: dst[d] = x[d] * cos[d] + x[d +- half] * signed_sin[d],
 * each product and the sum rounded to bfloat16 like torch's three bfloat16 ops
 * (a product of two bfloat16s is exact in float32, so this matches bit for bit).
 * `dst` may be `x`: the head is read whole before it is written. */
static inline void NAME(rope_head)(const T *x, const T *cos, const T *sin,
                             T *dst, int64_t head_dim) {
    T rotated[256];
    const int64_t half = head_dim / 2;
#pragma omp simd
    for (int64_t d = 0; d < head_dim; ++d) {
        const float a = ROUND(LOAD(x[d]) * LOAD(cos[d]));
        const T partner = x[d < half ? d + half : d - half];
        const float b =
            ROUND(LOAD(partner) * LOAD(sin[d]));
        rotated[d] = STORE(a + b);
    }
    memcpy(dst, rotated, sizeof(T) * (size_t)head_dim);
}

/* For each row of `qkv` ([rows, (H + 2 * KVH) * D]: q heads, k heads, v heads):
 * q_out[row] = rope(q), k = rope(k) in place in qkv, then the row's k and v are
 * stored at cache slot `slots[row]` of both caches ([num_slots, KVH, D]). `cos` and
 * `sin` are [rows, D] (sin with its first half negated). Returns 0, 1 for a head_dim
 * over 256 or odd, or 2 if a slot is outside 0 .. num_slots - 1 (then nothing is
 * written). */
int NAME(rope_cache)(T *qkv, const T *cos, const T *sin,
                    const int64_t *slots, T *q_out, T *k_cache, T *v_cache,
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
        T *row = qkv + r * width;
        const T *c = cos + r * head_dim, *s = sin + r * head_dim;
        for (int64_t h = 0; h < num_heads; ++h)
            NAME(rope_head)(row + h * head_dim, c, s, q_out + (r * num_heads + h) * head_dim, head_dim);
        T *k = row + num_heads * head_dim;
        for (int64_t h = 0; h < num_kv_heads; ++h)
            NAME(rope_head)(k + h * head_dim, c, s, k + h * head_dim, head_dim);
        memcpy(k_cache + slots[r] * kv_width, k, sizeof(T) * (size_t)kv_width);
        memcpy(v_cache + slots[r] * kv_width, k + kv_width, sizeof(T) * (size_t)kv_width);
    }
    return 0;
}

/* The parameters end here, so the next instantiation defines them afresh. */
#undef T
#undef LOAD
#undef STORE
#undef ROUND
#undef NAME
