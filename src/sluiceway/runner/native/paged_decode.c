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
 * Elements are bfloat16, passed as uint16_t bit patterns, or float32 (`paged_decode_f32`,
 * the cache of a float32 model on a CPU without bfloat16); all arithmetic is float32.
 * Two implementations: portable C (any head_dim up to 256, both element types), and,
 * for bfloat16 where the compiler
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

static inline void decode_span(const void *q, const void *k_cache, const void *v_cache,
                               const int32_t *table, int64_t begin, int64_t end, Partial part,
                               int64_t b, int64_t kvh, int64_t num_heads, int64_t num_kv_heads,
                               int64_t head_dim, int64_t block_size, float scale, float *scores,
                               int f32) {
    const int64_t group = num_heads / num_kv_heads;
    const int64_t row_stride = num_kv_heads * head_dim; /* between slots, in elements */
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
        const int64_t first = slot * row_stride + kvh * head_dim;
        for (int64_t i = 0; i < n; ++i) {
            load_row(row, elem(k_cache, first + i * row_stride, f32), head_dim, f32);
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
        const int64_t first = slot * row_stride + kvh * head_dim;
        for (int64_t i = 0; i < n; ++i) {
            load_row(row, elem(v_cache, first + i * row_stride, f32), head_dim, f32);
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

#define AVX512_CASE(G, C)                                                                    \
    case (G) * 100 + (C):                                                                    \
        decode_span_avx512(q, k_cache, v_cache, table, begin, end, part, b, kvh, num_heads,  \
                           num_kv_heads, block_size, scale, scores, G, C);                   \
        return 1;
#define AVX512_CASES(G) AVX512_CASE(G, 4) AVX512_CASE(G, 8)

/* 1 if a specialised kernel took this (G, head_dim), else 0. */
static int decode_span_fast(const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache,
                            const int32_t *table, int64_t begin, int64_t end, Partial part,
                            int64_t b, int64_t kvh, int64_t num_heads, int64_t num_kv_heads,
                            int64_t head_dim, int64_t block_size, float scale, float *scores) {
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
 * that many spans per context (for tests), 0 chooses. `f32`: every tensor but the
 * tables holds float32, not bfloat16 (the portable path only). */
static int paged_decode_any(const void *q, const void *k_cache, const void *v_cache,
                            const int32_t *block_tables, int64_t max_blocks,
                            const int32_t *seq_lens, void *out, int64_t num_seqs,
                            int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                            int64_t block_size, float scale, int num_threads, int portable,
                            int64_t spans, int f32) {
    if (num_kv_heads < 1 || head_dim > MAX_HEAD_DIM || num_heads % num_kv_heads ||
        num_heads / num_kv_heads > MAX_GROUP)
        return 1;
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
    return paged_decode_any(q, k_cache, v_cache, block_tables, max_blocks, seq_lens, out,
                            num_seqs, num_heads, num_kv_heads, head_dim, block_size, scale,
                            num_threads, portable, spans, 1);
}

/* Decode attention over a bfloat16 cache; see the top of this file for layouts (also
 * what `decode_one.c` calls). */
int paged_decode_bf16(const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache,
                      const int32_t *block_tables, int64_t max_blocks, const int32_t *seq_lens,
                      uint16_t *out, int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,
                      int64_t head_dim, int64_t block_size, float scale, int num_threads,
                      int portable, int64_t spans) {
    return paged_decode_any(q, k_cache, v_cache, block_tables, max_blocks, seq_lens, out,
                            num_seqs, num_heads, num_kv_heads, head_dim, block_size, scale,
                            num_threads, portable, spans, 0);
}
