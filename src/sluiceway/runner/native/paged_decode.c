/* Paged decode attention on the CPU, read straight from the KV cache blocks.
 *
 * One query per sequence. For each (sequence, KV head) pair the query heads that
 * share that KV head are scored against the sequence's context, softmaxed in
 * float32 and used to weight the values; nothing is gathered or padded, so the work
 * is proportional to the real context lengths. The pairs are independent and run
 * in parallel (OpenMP; the library links the libgomp torch has already loaded, so
 * both share one thread pool). When there are too few pairs to keep every thread
 * busy (a single sequence has one pair per KV head: 3 for 2 threads with the default
 * model), each context is cut into equal spans that run as separate items, each
 * keeping its own running max, exp-sum and weighted values, and the spans of a pair
 * are merged afterwards (split-context decoding, as in flash-decoding).
 *
 * Layouts (all contiguous, row-major):
 *   q, out        [B, H, D]
 *   caches        [num_blocks, block_size, KVH, D]
 *   block_tables  int32 [B, max_blocks]
 *   seq_lens      int32 [B]
 *   scales        float32 [num_blocks, block_size, KVH] (quantized caches only)
 * q and out are bfloat16, passed as uint16_t bit patterns, or float32. The caches
 * hold bfloat16 or float32 elements, or one-byte codes (int8, or fp8 e4m3 bit
 * patterns) with one scale per slot and KV head: element d of a row is
 * code[d] * scale (`paged_decode_cache`, see kv_cache.py). All arithmetic is float32.
 * Two implementations: portable C (any head_dim up to 256, every element type), and,
 * for bfloat16 q and caches where the compiler
 * targets AVX512-BF16, one specialised for head_dim 64 or 128 and up to 8 query
 * heads per KV head (about twice as fast as the portable one; docs/benchmarks.md).
 */
#include <math.h>
#include <omp.h>
#ifdef __AVX512BF16__
#include <immintrin.h>
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_math.h"

#define MAX_HEAD_DIM 256
#define MAX_GROUP 16

/* Turn each of the `group` score rows (length `len`, maxima `top`) into
 * exp(score - max) in place, and return each row's sum in `total`. */
static inline void softmax_rows(float *scores, int64_t len, int64_t group, const float *top,
                                float *total) {
    for (int64_t g = 0; g < group; ++g) {
        float *s = scores + g * len;
        const float m = top[g];
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < len; ++t) {
            s[t] = exp_nonpositive(s[t] - m);
            sum += s[t];
        }
        total[g] = sum;
    }
}

/* The run of context positions t .. t + n - 1 that share one cache block (it stops
 * at the block's end or at `end`): returns n and sets `*slot` to position t's slot. */
static inline __attribute__((always_inline)) int64_t block_run(const int32_t *table, int64_t t,
                                                               int64_t end, int64_t block_size,
                                                               int64_t *slot) {
    const int64_t in_block = t % block_size;
    *slot = (int64_t)table[t / block_size] * block_size + in_block;
    return block_size - in_block < end - t ? block_size - in_block : end - t;
}

/* One item's share of a pair's attention: the partial results of the query heads
 * that share KV head `kvh` over context positions `begin .. end - 1` of sequence `b`:
 * per head g, top[g] = the highest score, total[g] = sum of exp(score - top[g]) and
 * acc[g * head_dim + d] = sum of exp(score - top[g]) * value[d]. `scores` holds at
 * least group * (end - begin) floats. */
typedef struct {
    float *acc; /* [group, head_dim] */
    float *top; /* [group] */
    float *total; /* [group] */
} Partial;

/* `n` elements at `src` (bfloat16 bit patterns, or float32 when `f32`) as float32. */
static inline void load_row(float *dst, const void *src, int64_t n, int f32) {
    if (f32) {
        memcpy(dst, src, sizeof(float) * (size_t)n);
        return;
    }
    const uint16_t *h = src;
    for (int64_t d = 0; d < n; ++d) dst[d] = bf16_to_float(h[d]);
}

/* Element `i` of `base` (bfloat16 or float32), as a pointer. */
static inline const void *elem(const void *base, int64_t i, int f32) {
    return (const char *)base + i * (f32 ? 4 : 2);
}

/* What a cache's elements are. */
enum { CACHE_BF16 = 0, CACHE_F32 = 1, CACHE_INT8 = 2, CACHE_FP8 = 3 };

/* One layer's key or value cache: the elements and, for the one-byte kinds, a
 * scale per (slot, KV head). */
typedef struct {
    const void *data;
    const float *scales;
    int kind;
} Cache;

/* fp8 e4m3 (the "fn" variant: no infinities, 0x7f and 0xff are NaN) as float32,
 * all 256 codes, filled once before the first parallel region. */
static float fp8_values[256];
static int fp8_ready;

static void fill_fp8_values(void) {
    if (fp8_ready) return;
    for (int c = 0; c < 256; ++c) {
        const int sign = c >> 7, exponent = (c >> 3) & 15, mantissa = c & 7;
        float v;
        if (exponent == 15 && mantissa == 7)
            v = NAN;
        else if (exponent == 0)
            v = ldexpf((float)mantissa / 8.0f, -6);
        else
            v = ldexpf(1.0f + (float)mantissa / 8.0f, exponent - 7);
        fp8_values[c] = sign ? -v : v;
    }
    fp8_ready = 1;
}

/* Row `row` (slot * KVH + KV head) of `cache` as `n` float32s. */
static inline void load_cache_row(float *dst, Cache cache, int64_t row, int64_t n) {
    switch (cache.kind) {
    case CACHE_INT8: {
        const int8_t *c = (const int8_t *)cache.data + row * n;
        const float s = cache.scales[row];
#pragma omp simd
        for (int64_t d = 0; d < n; ++d) dst[d] = (float)c[d] * s;
        return;
    }
    case CACHE_FP8: {
        const uint8_t *c = (const uint8_t *)cache.data + row * n;
        const float s = cache.scales[row];
        for (int64_t d = 0; d < n; ++d) dst[d] = fp8_values[c[d]] * s;
        return;
    }
    default:
        load_row(dst, elem(cache.data, row * n, cache.kind == CACHE_F32), n,
                 cache.kind == CACHE_F32);
    }
}

static inline void decode_span(const void *q, Cache k_cache, Cache v_cache,
                               const int32_t *table, int64_t begin, int64_t end, Partial part,
                               int64_t b, int64_t kvh, int64_t num_heads, int64_t num_kv_heads,
                               int64_t head_dim, int64_t block_size, float scale, float *scores,
                               int f32) {
    const int64_t group = num_heads / num_kv_heads;
    const int64_t len = end - begin;
    float qf[MAX_GROUP][MAX_HEAD_DIM];
    float row[MAX_HEAD_DIM];
    for (int64_t g = 0; g < group; ++g) {
        load_row(qf[g], elem(q, (b * num_heads + kvh * group + g) * head_dim, f32), head_dim, f32);
        for (int64_t d = 0; d < head_dim; ++d) qf[g][d] *= scale;
        for (int64_t d = 0; d < head_dim; ++d) part.acc[g * head_dim + d] = 0.0f;
        part.top[g] = -INFINITY;
    }
    /* Scores, a block's run of slots at a time (no division per token). */
    for (int64_t t = begin, n, slot; t < end; t += n) {
        n = block_run(table, t, end, block_size, &slot);
        const int64_t first = slot * num_kv_heads + kvh; /* the cache row of position t */
        for (int64_t i = 0; i < n; ++i) {
            load_cache_row(row, k_cache, first + i * num_kv_heads, head_dim);
            for (int64_t g = 0; g < group; ++g) {
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int64_t d = 0; d < head_dim; ++d) dot += qf[g][d] * row[d];
                scores[g * len + t - begin + i] = dot;
                part.top[g] = dot > part.top[g] ? dot : part.top[g];
            }
        }
    }
    softmax_rows(scores, len, group, part.top, part.total);
    for (int64_t t = begin, n, slot; t < end; t += n) {
        n = block_run(table, t, end, block_size, &slot);
        const int64_t first = slot * num_kv_heads + kvh;
        for (int64_t i = 0; i < n; ++i) {
            load_cache_row(row, v_cache, first + i * num_kv_heads, head_dim);
            for (int64_t g = 0; g < group; ++g) {
                const float w = scores[g * len + t - begin + i];
                float *acc = part.acc + g * head_dim;
#pragma omp simd
                for (int64_t d = 0; d < head_dim; ++d) acc[d] += w * row[d];
            }
        }
    }
}

/* Ask for slots `t .. t + n - 1` of one KV head (head_dim bfloat16s each, `row_stride`
 * apart) to be brought into cache. At batch 1 decode is bound by memory latency: a
 * context's blocks sit anywhere in the cache, so the hardware prefetcher loses the
 * stream at every block boundary, and every layer's weights pass through the caches
 * between two reads of its KV blocks. */
static inline void prefetch_rows(const uint16_t *row, int64_t n, int64_t row_stride,
                                 int64_t head_dim) {
    for (int64_t i = 0; i < n; ++i, row += row_stride)
        for (int64_t off = 0; off < head_dim; off += 32) __builtin_prefetch(row + off);
}

#ifdef __AVX512BF16__
/* The same span with AVX512-BF16: q.k with vdpbf16ps straight from the bf16 cache
 * (products exact in float32, summed in float32), scaled after the dot; values
 * widened to float32 and accumulated in registers. `G` query heads per KV head and
 * `C` = head_dim / 16 are compile-time constants at every call. */
static inline __attribute__((always_inline)) void decode_span_avx512(
    const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache, const int32_t *table,
    int64_t begin, int64_t end, Partial part, int64_t b, int64_t kvh, int64_t num_heads,
    int64_t num_kv_heads, int64_t block_size, float scale, float *scores, const int G,
    const int C) {
    const int64_t head_dim = 16 * C;
    const int64_t row_stride = num_kv_heads * head_dim;
    const int64_t len = end - begin;
    __m512bh qb[G][C / 2];
    __m512 acc[G][C];
    for (int g = 0; g < G; ++g) {
        const uint16_t *src = q + (b * num_heads + kvh * G + g) * head_dim;
        for (int c = 0; c < C / 2; ++c) qb[g][c] = (__m512bh)_mm512_loadu_si512(src + 32 * c);
        for (int c = 0; c < C; ++c) acc[g][c] = _mm512_setzero_ps();
        part.top[g] = -INFINITY;
    }
    for (int64_t t = begin, n, slot; t < end; t += n) {
        n = block_run(table, t, end, block_size, &slot);
        const uint16_t *key = k_cache + slot * row_stride + kvh * head_dim;
        /* This run's values (read in the second pass) and the next run's keys. */
        prefetch_rows(v_cache + slot * row_stride + kvh * head_dim, n, row_stride, head_dim);
        if (t + n < end) {
            const int64_t next_n = end - t - n < block_size ? end - t - n : block_size;
            prefetch_rows(k_cache + (int64_t)table[(t + n) / block_size] * block_size * row_stride +
                              kvh * head_dim,
                          next_n, row_stride, head_dim);
        }
        for (int64_t i = 0; i < n; ++i, key += row_stride) {
            __m512bh k[C / 2];
            for (int c = 0; c < C / 2; ++c) k[c] = (__m512bh)_mm512_loadu_si512(key + 32 * c);
            for (int g = 0; g < G; ++g) {
                __m512 p = _mm512_dpbf16_ps(_mm512_setzero_ps(), qb[g][0], k[0]);
                for (int c = 1; c < C / 2; ++c) p = _mm512_dpbf16_ps(p, qb[g][c], k[c]);
                const float dot = _mm512_reduce_add_ps(p) * scale;
                scores[g * len + t - begin + i] = dot;
                part.top[g] = dot > part.top[g] ? dot : part.top[g];
            }
        }
    }
    softmax_rows(scores, len, G, part.top, part.total);
    for (int64_t t = begin, n, slot; t < end; t += n) {
        n = block_run(table, t, end, block_size, &slot);
        const uint16_t *value = v_cache + slot * row_stride + kvh * head_dim;
        for (int64_t i = 0; i < n; ++i, value += row_stride) {
            __m512 v[C];
            for (int c = 0; c < C; ++c)
                v[c] = _mm512_castsi512_ps(_mm512_slli_epi32(
                    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(value + 16 * c))),
                    16));
            for (int g = 0; g < G; ++g) {
                const __m512 w = _mm512_set1_ps(scores[g * len + t - begin + i]);
                for (int c = 0; c < C; ++c) acc[g][c] = _mm512_fmadd_ps(w, v[c], acc[g][c]);
            }
        }
    }
    for (int g = 0; g < G; ++g)
        for (int c = 0; c < C; ++c) _mm512_storeu_ps(part.acc + g * head_dim + 16 * c, acc[g][c]);
}

/* Sixteen cache elements at `p` as float32: int8 codes as they are; fp8 e4m3
 * codes times CODES_FP8_UNIT, by moving each code's bits into a float16 (sign to
 * bit 15, exponent and mantissa to bits 7..14) and widening that: float16's
 * exponent bias is 8 above e4m3's, subnormals included, so the float16 is the
 * code's value / 256. (NaN codes, which the cache never stores, read as 480.) */
#define CODES_FP8_UNIT 256.0f
static inline __attribute__((always_inline)) __m512 load_codes16(const uint8_t *p, const int kind) {
    const __m128i bytes = _mm_loadu_si128((const __m128i *)p);
    if (kind == CACHE_INT8) return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
    const __m256i wide = _mm256_cvtepu8_epi16(bytes);
    const __m256i half = _mm256_or_si256(
        _mm256_and_si256(_mm256_slli_epi16(wide, 7), _mm256_set1_epi16(0x3f80)),
        _mm256_and_si256(_mm256_slli_epi16(wide, 8), _mm256_set1_epi16((short)0x8000)));
    return _mm512_cvtph_ps(half);
}

/* The span over a cache of one-byte codes (`KIND` CACHE_INT8 or CACHE_FP8): the
 * query in float32, each key row widened to float32 and its dot scaled once by
 * the row's scale; each value row weighted by its score times its scale. Only
 * `C` = head_dim / 16 and the kind are compile-time constants: the `group`
 * query heads loop at run time, which costs little beside the widening and
 * keeps the library's build short. */
static inline __attribute__((always_inline)) void decode_span_avx512_codes(
    const uint16_t *q, Cache k_cache, Cache v_cache, const int32_t *table, int64_t begin,
    int64_t end, Partial part, int64_t b, int64_t kvh, int64_t num_heads, int64_t num_kv_heads,
    int64_t block_size, float scale, float *scores, const int64_t group, const int C,
    const int KIND) {
    const int64_t head_dim = 16 * C;
    const int64_t len = end - begin;
    const float unit = KIND == CACHE_FP8 ? CODES_FP8_UNIT : 1.0f;
    const uint8_t *k_codes = k_cache.data, *v_codes = v_cache.data;
    __m512 qf[MAX_GROUP][C];
    for (int64_t g = 0; g < group; ++g) {
        const uint16_t *src = q + (b * num_heads + kvh * group + g) * head_dim;
        for (int c = 0; c < C; ++c)
            qf[g][c] = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + 16 * c))), 16));
        part.top[g] = -INFINITY;
    }
    for (int64_t t = begin, n, slot; t < end; t += n) {
        n = block_run(table, t, end, block_size, &slot);
        int64_t row = slot * num_kv_heads + kvh;
        for (int64_t i = 0; i < n; ++i, row += num_kv_heads) {
            __m512 k[C];
            for (int c = 0; c < C; ++c) k[c] = load_codes16(k_codes + row * head_dim + 16 * c, KIND);
            const float row_scale = k_cache.scales[row] * scale * unit;
            for (int64_t g = 0; g < group; ++g) {
                __m512 p = _mm512_mul_ps(qf[g][0], k[0]);
                for (int c = 1; c < C; ++c) p = _mm512_fmadd_ps(qf[g][c], k[c], p);
                const float dot = _mm512_reduce_add_ps(p) * row_scale;
                scores[g * len + t - begin + i] = dot;
                part.top[g] = dot > part.top[g] ? dot : part.top[g];
            }
        }
    }
    softmax_rows(scores, len, group, part.top, part.total);
    /* The values a pass of up to 16 / C heads at a time, whose accumulators stay
     * in registers (constant indices once the heads loop unrolls). */
    const int HEADS = 16 / C;
    for (int64_t g0 = 0; g0 < group; g0 += HEADS) {
        __m512 acc[16 / C][C];
        for (int h = 0; h < HEADS; ++h)
            for (int c = 0; c < C; ++c) acc[h][c] = _mm512_setzero_ps();
        for (int64_t t = begin, n, slot; t < end; t += n) {
            n = block_run(table, t, end, block_size, &slot);
            int64_t row = slot * num_kv_heads + kvh;
            for (int64_t i = 0; i < n; ++i, row += num_kv_heads) {
                __m512 v[C];
                for (int c = 0; c < C; ++c)
                    v[c] = load_codes16(v_codes + row * head_dim + 16 * c, KIND);
                const float row_scale = v_cache.scales[row] * unit;
                for (int h = 0; h < HEADS; ++h) {
                    if (g0 + h >= group) break;
                    const __m512 w =
                        _mm512_set1_ps(scores[(g0 + h) * len + t - begin + i] * row_scale);
                    for (int c = 0; c < C; ++c) acc[h][c] = _mm512_fmadd_ps(w, v[c], acc[h][c]);
                }
            }
        }
        for (int h = 0; h < HEADS && g0 + h < group; ++h)
            for (int c = 0; c < C; ++c)
                _mm512_storeu_ps(part.acc + (g0 + h) * head_dim + 16 * c, acc[h][c]);
    }
}

#define AVX512_CASE(G, C)                                                                    \
    case (G) * 100 + (C):                                                                    \
        decode_span_avx512(q, k_bf16, v_bf16, table, begin, end, part, b, kvh, num_heads,    \
                           num_kv_heads, block_size, scale, scores, G, C);                   \
        return 1;
#define AVX512_CASES(G) AVX512_CASE(G, 4) AVX512_CASE(G, 8)
#define CODES_CASE(KIND, C)                                                                 \
    case (KIND) * 100 + (C):                                                                \
        decode_span_avx512_codes(q, k, v, table, begin, end, part, b, kvh, num_heads,       \
                                 num_kv_heads, block_size, scale, scores,                   \
                                 num_heads / num_kv_heads, C, KIND);                        \
        return 1;

/* 1 if a specialised kernel took this (cache kind, G, head_dim), else 0. */
static int decode_span_fast(const uint16_t *q, Cache k, Cache v, const int32_t *table,
                            int64_t begin, int64_t end, Partial part, int64_t b, int64_t kvh,
                            int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                            int64_t block_size, float scale, float *scores) {
    if (head_dim % 16 || k.kind != v.kind) return 0;
    if (k.kind == CACHE_INT8 || k.kind == CACHE_FP8) {
        switch (k.kind * 100 + head_dim / 16) {
            CODES_CASE(CACHE_INT8, 4) CODES_CASE(CACHE_INT8, 8)
            CODES_CASE(CACHE_FP8, 4) CODES_CASE(CACHE_FP8, 8)
        }
        return 0;
    }
    if (k.kind != CACHE_BF16) return 0;
    const uint16_t *k_bf16 = k.data, *v_bf16 = v.data;
    switch ((num_heads / num_kv_heads) * 100 + head_dim / 16) {
        AVX512_CASES(1) AVX512_CASES(2) AVX512_CASES(3) AVX512_CASES(4)
        AVX512_CASES(5) AVX512_CASES(6) AVX512_CASES(7) AVX512_CASES(8)
    }
    return 0;
}
#endif

/* Merge the `parts` partial results of one pair (each for `group` heads) and write
 * the attention of its query heads to `out` ([group, head_dim], bfloat16, or float32
 * when `f32`). */
static void finish_pair(const float *acc, const float *top, const float *total, int64_t parts,
                        int64_t group, int64_t head_dim, void *out, int f32) {
    for (int64_t g = 0; g < group; ++g) {
        float m = -INFINITY;
        for (int64_t p = 0; p < parts; ++p) m = top[p * group + g] > m ? top[p * group + g] : m;
        float merged[MAX_HEAD_DIM], sum = 0.0f;
        for (int64_t d = 0; d < head_dim; ++d) merged[d] = 0.0f;
        for (int64_t p = 0; p < parts; ++p) {
            /* A span's values were weighted relative to its own max. */
            const float w = parts == 1 ? 1.0f : exp_nonpositive(top[p * group + g] - m); /* -inf: 0 */
            const float *a = acc + (p * group + g) * head_dim;
            sum += w * total[p * group + g];
#pragma omp simd
            for (int64_t d = 0; d < head_dim; ++d) merged[d] += w * a[d];
        }
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        if (f32) {
            float *o = (float *)out + g * head_dim;
            for (int64_t d = 0; d < head_dim; ++d) o[d] = merged[d] * inv;
        } else {
            uint16_t *o = (uint16_t *)out + g * head_dim;
            for (int64_t d = 0; d < head_dim; ++d) o[d] = float_to_bf16(merged[d] * inv);
        }
    }
}

/* How many spans each context is cut into: 1 while there are enough (sequence, KV
 * head) pairs to keep `num_threads` threads evenly busy; otherwise enough spans to
 * make the item count a multiple of the thread count, each at least MIN_SPAN slots
 * long (a span costs a few hundred nanoseconds to set up and merge). */
#define MIN_SPAN 32
static int64_t spans_per_context(int64_t pairs, int num_threads, int64_t longest) {
    if (num_threads < 2 || pairs % num_threads == 0 || pairs >= 4 * num_threads) return 1;
    int64_t a = pairs, b = num_threads;
    while (b) { const int64_t r = a % b; a = b; b = r; } /* gcd */
    int64_t spans = num_threads / a;
    while (spans > 1 && longest / spans < MIN_SPAN) --spans;
    return spans;
}

/* Returns 0 on success, 1 for shapes this kernel does not take (head_dim above
 * MAX_HEAD_DIM, more than MAX_GROUP query heads per KV head, heads not a multiple of
 * KV heads), 2 when scratch memory could not be allocated. `portable` = 1 skips the
 * AVX512-BF16 path (so tests can check both on one machine); `spans` > 0 forces
 * that many spans per context (for tests), 0 chooses. `f32`: q and out hold float32,
 * not bfloat16; the caches hold what their kinds say (the AVX512-BF16 path takes
 * bfloat16 throughout). */
static int paged_decode_any(const void *q, Cache k_cache, Cache v_cache,
                            const int32_t *block_tables, int64_t max_blocks,
                            const int32_t *seq_lens, void *out, int64_t num_seqs,
                            int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                            int64_t block_size, float scale, int num_threads, int portable,
                            int64_t spans, int f32) {
    if (num_kv_heads < 1 || head_dim > MAX_HEAD_DIM || num_heads % num_kv_heads ||
        num_heads / num_kv_heads > MAX_GROUP)
        return 1;
    if (k_cache.kind == CACHE_FP8 || v_cache.kind == CACHE_FP8) fill_fp8_values();
#ifndef __AVX512BF16__
    (void)portable; /* there is only the portable path */
#endif
    const int64_t group = num_heads / num_kv_heads;
    const int64_t pairs = num_seqs * num_kv_heads;
    int64_t longest = 1;
    for (int64_t b = 0; b < num_seqs; ++b)
        if (seq_lens[b] > longest) longest = seq_lens[b];
    if (spans < 1) spans = spans_per_context(pairs, num_threads, longest);
    const int64_t items = pairs * spans;
    /* Partial results of every item: acc [items, group, head_dim], top and total
     * [items, group]; item (pair, span) is at pair * spans + span. */
    float *scratch = malloc(sizeof(float) * (size_t)(items * group * (head_dim + 2)));
    if (scratch == NULL) return 2;
    float *acc_all = scratch, *top_all = scratch + items * group * head_dim;
    float *total_all = top_all + items * group;
    const int64_t span_len = (longest + spans - 1) / spans;
    /* Each thread's score rows, allocated here so that no thread can fail alone
     * (every thread must reach the merge loop's worksharing). */
    float *scores_all = malloc(sizeof(float) * (size_t)(num_threads * group * span_len));
    if (scores_all == NULL) {
        free(scratch);
        return 2;
    }
#pragma omp parallel num_threads(num_threads)
    {
        float *scores = scores_all + (int64_t)omp_get_thread_num() * group * span_len;
#pragma omp for schedule(static)
        for (int64_t item = 0; item < items; ++item) {
            const int64_t pair = item / spans, span = item % spans;
            const int64_t b = pair / num_kv_heads, kvh = pair % num_kv_heads;
            const int64_t len = seq_lens[b];
            /* Spans cut each context in equal parts, so a short context's later
             * spans may be empty (their max stays -inf and they weigh nothing). */
            const int64_t per = (len + spans - 1) / spans;
            const int64_t begin = span * per < len ? span * per : len;
            const int64_t end = begin + per < len ? begin + per : len;
            const Partial part = {acc_all + item * group * head_dim, top_all + item * group,
                                  total_all + item * group};
            if (begin == end) {
                for (int64_t g = 0; g < group; ++g) part.top[g] = -INFINITY, part.total[g] = 0.0f;
                for (int64_t i = 0; i < group * head_dim; ++i) part.acc[i] = 0.0f;
                continue;
            }
            const int32_t *table = block_tables + b * max_blocks;
#ifdef __AVX512BF16__
            if (!portable && !f32 &&
                decode_span_fast(q, k_cache, v_cache, table, begin, end, part, b, kvh, num_heads,
                                 num_kv_heads, head_dim, block_size, scale, scores))
                continue;
#endif
            decode_span(q, k_cache, v_cache, table, begin, end, part, b, kvh, num_heads,
                        num_kv_heads, head_dim, block_size, scale, scores, f32);
        }
        /* The implicit barrier above: every span is done before any pair merges. */
#pragma omp for schedule(static)
        for (int64_t pair = 0; pair < pairs; ++pair) {
            const int64_t first = pair * spans;
            finish_pair(acc_all + first * group * head_dim, top_all + first * group,
                        total_all + first * group, spans, group, head_dim,
                        (char *)out + pair * group * head_dim * (f32 ? 4 : 2), f32);
        }
    }
    free(scores_all);
    free(scratch);
    return 0;
}

/* Decode attention over a float32 cache; see the top of this file for layouts. */
int paged_decode_f32(const float *q, const float *k_cache, const float *v_cache,
                     const int32_t *block_tables, int64_t max_blocks, const int32_t *seq_lens,
                     float *out, int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,
                     int64_t head_dim, int64_t block_size, float scale, int num_threads,
                     int portable, int64_t spans) {
    const Cache k = {k_cache, NULL, CACHE_F32}, v = {v_cache, NULL, CACHE_F32};
    return paged_decode_any(q, k, v, block_tables, max_blocks, seq_lens, out, num_seqs,
                            num_heads, num_kv_heads, head_dim, block_size, scale, num_threads,
                            portable, spans, 1);
}

/* Decode attention over a bfloat16 cache; see the top of this file for layouts (also
 * what `decode_one.c` calls). */
int paged_decode_bf16(const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache,
                      const int32_t *block_tables, int64_t max_blocks, const int32_t *seq_lens,
                      uint16_t *out, int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,
                      int64_t head_dim, int64_t block_size, float scale, int num_threads,
                      int portable, int64_t spans) {
    const Cache k = {k_cache, NULL, CACHE_BF16}, v = {v_cache, NULL, CACHE_BF16};
    return paged_decode_any(q, k, v, block_tables, max_blocks, seq_lens, out, num_seqs,
                            num_heads, num_kv_heads, head_dim, block_size, scale, num_threads,
                            portable, spans, 0);
}

/* Decode attention over a cache of kind `cache_kind` (CACHE_*; `k_scales` and
 * `v_scales` for the one-byte kinds, else NULL), q and out bfloat16 or, with
 * `q_f32`, float32; see the top of this file for layouts. */
int paged_decode_cache(const void *q, int q_f32, const void *k_cache, const void *v_cache,
                       const float *k_scales, const float *v_scales, int cache_kind,
                       const int32_t *block_tables, int64_t max_blocks, const int32_t *seq_lens,
                       void *out, int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,
                       int64_t head_dim, int64_t block_size, float scale, int num_threads,
                       int portable, int64_t spans) {
    if (cache_kind < CACHE_BF16 || cache_kind > CACHE_FP8 ||
        (cache_kind >= CACHE_INT8 && (k_scales == NULL || v_scales == NULL)))
        return 1;
    const Cache k = {k_cache, k_scales, cache_kind}, v = {v_cache, v_scales, cache_kind};
    return paged_decode_any(q, k, v, block_tables, max_blocks, seq_lens, out, num_seqs,
                            num_heads, num_kv_heads, head_dim, block_size, scale, num_threads,
                            portable, spans, q_f32);
}

/* float32 `f` as fp8 e4m3fn bits, rounded to the nearest (ties to even), as
 * torch converts: a magnitude of 480 or more becomes NaN (the cache's rows are
 * scaled to at most 448 first). */
static inline uint8_t float_to_fp8(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    const uint32_t sign = bits & 0x80000000u;
    bits ^= sign;
    uint8_t result;
    if (bits >= (1087u << 20)) {
        result = 0x7f;
    } else if (bits < (121u << 23)) {
        /* Below the normal range: adding 2**-6 * 2**8 lines the subnormal step up
         * with float32's last mantissa bit, which the addition rounds to even. */
        const uint32_t denorm = 141u << 23;
        float a, m;
        memcpy(&a, &bits, 4);
        memcpy(&m, &denorm, 4);
        a += m;
        memcpy(&bits, &a, 4);
        result = (uint8_t)(bits - denorm);
    } else {
        const uint32_t mantissa_odd = (bits >> 20) & 1;
        bits += ((uint32_t)(7 - 127) << 23) + 0x7ffff;
        bits += mantissa_odd;
        result = (uint8_t)(bits >> 20);
    }
    return result | (uint8_t)(sign >> 24);
}

/* Quantize `count` tokens' rows (`rows` [count, KVH, D], bfloat16, or float32
 * when `rows_f32`) and store them at `slots` of one layer's cache of kind
 * `kind` (CACHE_INT8 or CACHE_FP8): `codes` [num_slots, KVH, D], `scales`
 * [num_slots, KVH]. Each (token, KV head) row gets scale = its largest magnitude
 * / the largest code, and codes = row / scale rounded, exactly as
 * `kv_cache.quantize_rows` computes them. Returns 0, 1 for a kind or head_dim
 * this does not take, 2 for a slot outside the cache (nothing is written then). */
int kv_cache_store(const void *rows, int rows_f32, const int64_t *slots, int64_t count,
                   int64_t num_kv_heads, int64_t head_dim, int64_t num_slots, int kind,
                   void *codes, float *scales, int num_threads) {
    if ((kind != CACHE_INT8 && kind != CACHE_FP8) || head_dim > MAX_HEAD_DIM) return 1;
    for (int64_t t = 0; t < count; ++t)
        if (slots[t] < 0 || slots[t] >= num_slots) return 2;
    const float top = kind == CACHE_INT8 ? 127.0f : 448.0f;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (count * num_kv_heads > 8)
    for (int64_t r = 0; r < count * num_kv_heads; ++r) {
        const int64_t t = r / num_kv_heads, h = r % num_kv_heads;
        float x[MAX_HEAD_DIM];
        load_row(x, elem(rows, r * head_dim, rows_f32), head_dim, rows_f32);
        float amax = 0.0f;
        for (int64_t d = 0; d < head_dim; ++d) amax = fabsf(x[d]) > amax ? fabsf(x[d]) : amax;
        const float s = amax / top, divisor = s > 0.0f ? s : 1.0f;
        const int64_t row = slots[t] * num_kv_heads + h;
        scales[row] = s;
        if (kind == CACHE_INT8) {
            int8_t *out = (int8_t *)codes + row * head_dim;
            for (int64_t d = 0; d < head_dim; ++d) {
                float q = nearbyintf(x[d] / divisor);
                q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
                out[d] = (int8_t)q;
            }
        } else {
            uint8_t *out = (uint8_t *)codes + row * head_dim;
            for (int64_t d = 0; d < head_dim; ++d) out[d] = float_to_fp8(x[d] / divisor);
        }
    }
    return 0;
}
