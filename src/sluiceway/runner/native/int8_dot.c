/* Weight-only int4 and int8 products with int8 activations: y[r, o] = sum_i x[r, i] *
 * w[o, i] for a few rows r (decode), with the dot products in integers.
 *
 * A decode step streams every weight once, so it is bound by memory if the
 * arithmetic keeps up. Converting each weight to a float (the bfloat16 and float32
 * kernels, quantized_matvec.c and quantized_matmul_f32.c) costs several
 * instructions per 32 weights per row; here each activation row is quantized once
 * per call, per block of 32 inputs, to int8 with a float32 scale (llama.cpp's
 * Q8_0), and 64 weight bytes meet 4 activation bytes in one instruction:
 * `vpdpbusd` (AVX512-VNNI, 16 int32 lanes; AVX-VNNI, 8) or `vpmaddubsw` +
 * `vpmaddwd` (AVX2). Integer sums are exact; each block's sum becomes a float once.
 *
 * Layout (`int8_dot.py` packs it at load time): output rows in tiles of TILE = 16,
 * the last tile padded with zero rows; inside a tile, for each block of 32 inputs,
 * 4-input pieces of the 16 rows side by side, so one 64-byte load holds the same 4
 * inputs of all 16 rows and one vpdpbusd against those 4 activation bytes
 * (broadcast) adds them to the 16 rows' lanes: no horizontal sums, and each
 * thread streams its tiles front to back (llama.cpp repacks Q4_0 the same way, in
 * 8-row tiles).
 *
 * int4, per tile and group g of 32 inputs (w = (q - 8) * scale + offset, q 0..15,
 * `Int4Weight`'s values):
 *   256 bytes  piece s = 0..3 is 64 bytes; byte 4r + j holds q[r, 32g + 4s + j] in
 *              its low nibble and q[r, 32g + 16 + 4s + j] in its high one
 *   scales     16 values (row r's scale of group g)
 *   offsets    16 values, the same type; none in SCALES_F16
 * The scale format: SCALES_BF16 (2) or SCALES_F32 (4), scales and offsets in
 * bfloat16 or float32 (the number is the bytes of each); SCALES_F16 (1), float16
 * scales and every offset zero: GGUF's Q4_0 as stored (its d and codes), 18 bytes
 * per row and group like the file, where bfloat16 scales and zero offsets took 20
 * and rounded d. A decode step reads every weight byte once, so those 2 bytes are
 * a tenth of a Q4_0 model's step.
 * Group g of row r adds scale * dx * (sum (q - 8) * xq) + offset * dx * sum xq, the
 * integer sums exact, with dx the activations' block scale.
 * int8, per tile (w = q * scale[o], `Int8Weight`'s values, the input padded with
 * zero columns to a multiple of 32; scale format 4):
 *   per block b of 32 inputs, 512 bytes: piece c = 0..7 is 64 bytes; byte 4r + j
 *              holds q[r, 32b + 4c + j] + 128 (unsigned, for vpdpbusd)
 *   scales     16 float32, one per row, after the last block
 * Row r adds dx * (sum (q + 128) * xq - 128 * sum xq) per block, times its scale.
 * int8 in blocks (scale format SCALES_F16: w = q * d[o, b], GGUF's Q8_0 as stored,
 * its codes and float16 d; the input a multiple of 32): per block the same 512
 * code bytes, then the 16 rows' d of that block, 544 bytes for 16 rows like the
 * file's 34 a row; row r adds d * dx * (sum (q + 128) * xq - 128 * sum xq).
 *
 * ISA levels (`int8_dot_best_level`; a caller may ask for a lower one to test it):
 * 3 AVX512-VNNI, 2 AVX-VNNI, 1 AVX2, 0 portable C. Every x86 level is compiled
 * with its own target attribute and chosen at run time; other CPUs get level 0.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_math.h"
#include "half_math.h"
#include "thread_rows.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define X86 1
#else
#define X86 0
#endif

#define TILE 16
#define BLOCK 32
/* Activation rows per pass over a tile: their accumulators fit the registers. */
#define MAX_ROWS 8

enum { LEVEL_SCALAR, LEVEL_AVX2, LEVEL_AVXVNNI, LEVEL_AVX512VNNI };

int int8_dot_best_level(void) {
#if X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw")) return LEVEL_AVX512VNNI;
    if (__builtin_cpu_supports("avxvnni") && __builtin_cpu_supports("avx2")) return LEVEL_AVXVNNI;
    if (__builtin_cpu_supports("avx2")) return LEVEL_AVX2;
#endif
    return LEVEL_SCALAR;
}

enum { SCALES_F16 = 1, SCALES_BF16 = 2, SCALES_F32 = 4 };

static int int4_format_known(int scale_format) {
    return scale_format == SCALES_F16 || scale_format == SCALES_BF16 || scale_format == SCALES_F32;
}

/* Bytes of one int4 group of a tile: the codes, then the scales and offsets. */
static int64_t int4_group_bytes(int scale_format) {
    return scale_format == SCALES_F16 ? 256 + 32 : 256 + 32 * scale_format;
}

/* Bytes of one tile. */
static int64_t int4_tile_bytes(int64_t k, int scale_format) { return (k / BLOCK) * int4_group_bytes(scale_format); }
/* int8: scale_format 4, one float32 scale a row after the blocks; SCALES_F16,
 * float16 scales after each block's codes. */
static int int8_format_known(int scale_format) { return scale_format == 4 || scale_format == SCALES_F16; }
static int64_t int8_block_bytes(int scale_format) { return scale_format == SCALES_F16 ? 512 + 2 * TILE : 512; }
static int64_t int8_tile_bytes(int64_t k, int scale_format) {
    return ((k + BLOCK - 1) / BLOCK) * int8_block_bytes(scale_format) +
           (scale_format == SCALES_F16 ? 0 : 4 * TILE);
}

/* ---- activations ---------------------------------------------------------------- */

/* Activation rows quantized per block: `xq` [m, blocks * 32] (zero past k), `dx`
 * [m, blocks] the scales, `sx` [m, blocks] the sums of xq. */
typedef struct {
    int8_t *xq;
    float *dx;
    int32_t *sx;
    int64_t blocks;
} Quantized;

/* xq = round-to-nearest-even(x / d) with d = max|x| / 127 over the block (x * (1 / d),
 * the products torch computes for the same formula, so tests can reproduce it). */
static void quantize_scalar(const void *x, int x_bf16, int64_t m, int64_t k, int8_t *xq,
                            float *dx, int32_t *sx) {
    const int64_t blocks = (k + BLOCK - 1) / BLOCK;
    for (int64_t r = 0; r < m; ++r) {
        for (int64_t b = 0; b < blocks; ++b) {
            float v[BLOCK];
            for (int i = 0; i < BLOCK; ++i) {
                const int64_t at = b * BLOCK + i;
                v[i] = at >= k ? 0.0f
                       : x_bf16 ? bf16_to_float(((const uint16_t *)x)[r * k + at])
                                : ((const float *)x)[r * k + at];
            }
            float amax = 0.0f;
            for (int i = 0; i < BLOCK; ++i) {
                const float a = fabsf(v[i]);
                amax = a > amax ? a : amax;
            }
            const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            int32_t sum = 0;
            int8_t *out = xq + r * blocks * BLOCK + b * BLOCK;
            for (int i = 0; i < BLOCK; ++i) {
                float q = nearbyintf(v[i] * id);
                q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q;
                out[i] = (int8_t)q;
                sum += out[i];
            }
            dx[r * blocks + b] = d;
            sx[r * blocks + b] = sum;
        }
    }
}

#if X86
/* int8_dot_quantize's arithmetic, 32 inputs at a time with AVX2: the same IEEE
 * products and round-to-nearest-even conversions, so the same integers. */
__attribute__((target("avx2,fma"))) static void quantize_avx2(const void *x, int x_bf16,
                                                               int64_t m, int64_t k, int8_t *xq,
                                                               float *dx, int32_t *sx) {
    const int64_t blocks = k / BLOCK;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t r = 0; r < m; ++r) {
        for (int64_t b = 0; b < blocks; ++b) {
            __m256 v[4];
            for (int i = 0; i < 4; ++i) {
                const int64_t at = r * k + b * BLOCK + 8 * i;
                v[i] = x_bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(
                                    _mm256_cvtepu16_epi32(_mm_loadu_si128(
                                        (const __m128i *)((const uint16_t *)x + at))),
                                    16))
                              : _mm256_loadu_ps((const float *)x + at);
            }
            __m256 top = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                       _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
            __m128 t4 = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
            t4 = _mm_max_ps(t4, _mm_movehl_ps(t4, t4));
            t4 = _mm_max_ss(t4, _mm_movehdup_ps(t4));
            const float amax = _mm_cvtss_f32(t4);
            const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            const __m256 scale = _mm256_set1_ps(id);
            __m256i q[4];
            for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], scale));
            const __m256i sums = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
            const __m256i packed = _mm256_permutevar8x32_epi32(
                _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])), order);
            _mm256_storeu_si256((__m256i *)(xq + r * blocks * BLOCK + b * BLOCK), packed);
            dx[r * blocks + b] = d;
            sx[r * blocks + b] = _mm_cvtsi128_si32(s4);
        }
    }
}
#endif

/* The rows quantized at `level`: AVX2 (the same integers) from level 1 up where k is
 * a multiple of 32, portable C otherwise. */
void int8_dot_quantize(const void *x, int x_bf16, int64_t m, int64_t k, int8_t *xq, float *dx,
                       int32_t *sx, int level) {
#if X86
    if (level >= LEVEL_AVX2 && k % BLOCK == 0) {
        quantize_avx2(x, x_bf16, m, k, xq, dx, sx);
        return;
    }
#else
    (void)level;
#endif
    quantize_scalar(x, x_bf16, m, k, xq, dx, sx);
}

static int quantize(const void *x, int x_bf16, int64_t m, int64_t k, int level, Quantized *a) {
    a->blocks = (k + BLOCK - 1) / BLOCK;
    a->xq = malloc((size_t)(m * a->blocks * BLOCK));
    a->dx = malloc(sizeof(float) * (size_t)(m * a->blocks));
    a->sx = malloc(sizeof(int32_t) * (size_t)(m * a->blocks));
    if (a->xq == NULL || a->dx == NULL || a->sx == NULL) {
        free(a->xq), free(a->dx), free(a->sx);
        return 2;
    }
    int8_dot_quantize(x, x_bf16, m, k, a->xq, a->dx, a->sx, level);
    return 0;
}

static void release(Quantized *a) { free(a->xq), free(a->dx), free(a->sx); }

/* Scale (or offset) i at `p`, in `scale_format`'s type, as a float. */
static inline float scale_at(const uint8_t *p, int i, int scale_format) {
    if (scale_format == SCALES_F16) return half_to_float(((const uint16_t *)p)[i]);
    if (scale_format == SCALES_BF16) return bf16_to_float(((const uint16_t *)p)[i]);
    float f;
    memcpy(&f, p + 4 * i, sizeof f);
    return f;
}

/* A tile's outputs (`acc` [rows][TILE] floats) into y's rows, `valid` columns. */
static inline void store_tile(const float *acc, int rows, int valid, void *y, int y_bf16,
                              int64_t out, int64_t row0, int64_t col0) {
    for (int r = 0; r < rows; ++r) {
        for (int t = 0; t < valid; ++t) {
            const int64_t at = (row0 + r) * out + col0 + t;
            if (y_bf16) ((uint16_t *)y)[at] = float_to_bf16(acc[r * TILE + t]);
            else ((float *)y)[at] = acc[r * TILE + t];
        }
    }
}

/* ---- portable C ----------------------------------------------------------------- */

static void int4_tile_scalar(const Quantized *a, int64_t r0, int rows, const uint8_t *w,
                             int scale_format, float *acc) {
    const int64_t groups = a->blocks, stride = int4_group_bytes(scale_format);
    const int offsets_held = scale_format != SCALES_F16;
    memset(acc, 0, sizeof(float) * (size_t)(rows * TILE));
    for (int64_t g = 0; g < groups; ++g) {
        const uint8_t *piece = w + g * stride, *scales = piece + 256;
        const uint8_t *offsets = scales + 16 * scale_format;
        for (int r = 0; r < rows; ++r) {
            const int8_t *x = a->xq + (r0 + r) * groups * BLOCK + g * BLOCK;
            const float d = a->dx[(r0 + r) * groups + g];
            const int32_t sx = a->sx[(r0 + r) * groups + g];
            for (int t = 0; t < TILE; ++t) {
                int32_t sum = 0;
                for (int s = 0; s < 4; ++s) {
                    for (int j = 0; j < 4; ++j) {
                        const uint8_t byte = piece[64 * s + 4 * t + j];
                        sum += (byte & 15) * x[4 * s + j] + (byte >> 4) * x[16 + 4 * s + j];
                    }
                }
                acc[r * TILE + t] += (float)(sum - 8 * sx) * (scale_at(scales, t, scale_format) * d);
                if (offsets_held) acc[r * TILE + t] += scale_at(offsets, t, scale_format) * (d * (float)sx);
            }
        }
    }
}

static void int8_tile_scalar(const Quantized *a, int64_t r0, int rows, const uint8_t *w,
                             int scale_format, float *acc) {
    const int64_t blocks = a->blocks, stride = int8_block_bytes(scale_format);
    const int in_blocks = scale_format == SCALES_F16;
    memset(acc, 0, sizeof(float) * (size_t)(rows * TILE));
    for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t *piece = w + b * stride;
        for (int r = 0; r < rows; ++r) {
            const int8_t *x = a->xq + (r0 + r) * blocks * BLOCK + b * BLOCK;
            const float d = a->dx[(r0 + r) * blocks + b];
            for (int t = 0; t < TILE; ++t) {
                int32_t sum = 0;
                for (int c = 0; c < 8; ++c)
                    for (int j = 0; j < 4; ++j) sum += (piece[64 * c + 4 * t + j] - 128) * x[4 * c + j];
                acc[r * TILE + t] += (float)sum * (in_blocks ? scale_at(piece + 512, t, SCALES_F16) * d : d);
            }
        }
    }
    if (in_blocks) return;
    const uint8_t *scales = w + blocks * 512;
    for (int r = 0; r < rows; ++r)
        for (int t = 0; t < TILE; ++t) acc[r * TILE + t] *= scale_at(scales, t, 4);
}

#if X86
/* ---- AVX512-VNNI ------------------------------------------------------------------ */
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"), always_inline)) inline

static AVX512 __m512 load_scales512(const uint8_t *p, int scale_format) {
    if (scale_format == SCALES_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    if (scale_format == SCALES_BF16)
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
    return _mm512_loadu_ps(p);
}

static inline int32_t load_i32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* One tile against `rows` (a compile-time constant) activation rows from r0. */
static AVX512 void int4_tile_512(const Quantized *a, int64_t r0, const int rows,
                                 const uint8_t *w, int scale_format, float *out) {
    const int64_t groups = a->blocks, stride = int4_group_bytes(scale_format);
    const int offsets_held = scale_format != SCALES_F16;
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    __m512 acc[MAX_ROWS];
    for (int r = 0; r < rows; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
        const uint8_t *piece = w + g * stride;
        _mm_prefetch((const char *)(piece + 8 * stride), _MM_HINT_T0);
        _mm_prefetch((const char *)(piece + 8 * stride + 64), _MM_HINT_T0);
        _mm_prefetch((const char *)(piece + 8 * stride + 128), _MM_HINT_T0);
        _mm_prefetch((const char *)(piece + 8 * stride + 192), _MM_HINT_T0);
        _mm_prefetch((const char *)(piece + 8 * stride + 256), _MM_HINT_T0);
        __m512i lo_sum[MAX_ROWS], hi_sum[MAX_ROWS];
        for (int r = 0; r < rows; ++r) lo_sum[r] = hi_sum[r] = _mm512_setzero_si512();
        for (int s = 0; s < 4; ++s) {
            const __m512i bytes = _mm512_loadu_si512(piece + 64 * s);
            const __m512i lo = _mm512_and_si512(bytes, low4);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low4);
            for (int r = 0; r < rows; ++r) {
                const int8_t *x = a->xq + (r0 + r) * groups * BLOCK + g * BLOCK;
                lo_sum[r] = _mm512_dpbusd_epi32(lo_sum[r], lo, _mm512_set1_epi32(load_i32(x + 4 * s)));
                /* Two chains for one row, one per row for more (as in int8_tile_512). */
                const __m512i high = _mm512_set1_epi32(load_i32(x + 16 + 4 * s));
                if (rows == 1) hi_sum[r] = _mm512_dpbusd_epi32(hi_sum[r], hi, high);
                else lo_sum[r] = _mm512_dpbusd_epi32(lo_sum[r], hi, high);
            }
        }
        const __m512 scales = load_scales512(piece + 256, scale_format);
        const __m512 offsets =
            offsets_held ? load_scales512(piece + 256 + 16 * scale_format, scale_format) : _mm512_setzero_ps();
        for (int r = 0; r < rows; ++r) {
            const int64_t at = (r0 + r) * groups + g;
            const float d = a->dx[at];
            const int32_t sx = a->sx[at];
            const __m512i both = rows == 1 ? _mm512_add_epi32(lo_sum[r], hi_sum[r]) : lo_sum[r];
            const __m512i sum = _mm512_sub_epi32(both, _mm512_set1_epi32(8 * sx));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(scales, _mm512_set1_ps(d)), acc[r]);
            if (offsets_held) acc[r] = _mm512_fmadd_ps(offsets, _mm512_set1_ps(d * (float)sx), acc[r]);
        }
    }
    for (int r = 0; r < rows; ++r) _mm512_storeu_ps(out + r * TILE, acc[r]);
}

static AVX512 void int8_tile_512(const Quantized *a, int64_t r0, const int rows,
                                 const uint8_t *w, int scale_format, float *out) {
    const int64_t blocks = a->blocks, stride = int8_block_bytes(scale_format);
    const int in_blocks = scale_format == SCALES_F16;
    __m512 acc[MAX_ROWS];
    for (int r = 0; r < rows; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t *piece = w + b * stride;
        for (int c = 0; c < 8; ++c) _mm_prefetch((const char *)(piece + 4 * stride + 64 * c), _MM_HINT_T0);
        if (in_blocks) _mm_prefetch((const char *)(piece + 4 * stride + 512), _MM_HINT_T0);
        /* Two chains of vpdpbusd for one row (its latency, not its throughput,
         * bounds a single chain); one per row for more rows, whose chains
         * interleave anyway and whose registers run out with two. */
        const int chains = rows == 1 ? 2 : 1;
        __m512i sum[MAX_ROWS][2];
        for (int r = 0; r < rows; ++r) sum[r][0] = sum[r][1] = _mm512_setzero_si512();
        for (int c = 0; c < 8; ++c) {
            const __m512i bytes = _mm512_loadu_si512(piece + 64 * c);
            for (int r = 0; r < rows; ++r) {
                const int8_t *x = a->xq + (r0 + r) * blocks * BLOCK + b * BLOCK;
                sum[r][c % chains] = _mm512_dpbusd_epi32(sum[r][c % chains], bytes, _mm512_set1_epi32(load_i32(x + 4 * c)));
            }
        }
        const __m512 block_scales = in_blocks ? load_scales512(piece + 512, SCALES_F16) : _mm512_setzero_ps();
        for (int r = 0; r < rows; ++r) {
            const int64_t at = (r0 + r) * blocks + b;
            const __m512i total = _mm512_sub_epi32(_mm512_add_epi32(sum[r][0], sum[r][1]),
                                                   _mm512_set1_epi32(128 * a->sx[at]));
            const __m512 d = _mm512_set1_ps(a->dx[at]);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total),
                                     in_blocks ? _mm512_mul_ps(block_scales, d) : d, acc[r]);
        }
    }
    if (in_blocks) {
        for (int r = 0; r < rows; ++r) _mm512_storeu_ps(out + r * TILE, acc[r]);
        return;
    }
    const __m512 scales = _mm512_loadu_ps(w + blocks * 512);
    for (int r = 0; r < rows; ++r) _mm512_storeu_ps(out + r * TILE, _mm512_mul_ps(acc[r], scales));
}

/* ---- AVX2 and AVX-VNNI (256 bits: a tile's 16 rows are two vectors of 8) ---------- */
#define AVX2 __attribute__((target("avx2,fma,f16c"), always_inline)) inline
#define AVXVNNI __attribute__((target("avx2,fma,f16c,avxvnni"), always_inline)) inline

static AVX2 __m256 load_scales256(const uint8_t *p, int scale_format) {
    if (scale_format == SCALES_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    if (scale_format == SCALES_BF16)
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    return _mm256_loadu_ps((const float *)p);
}

/* sum += 4-byte dot products of unsigned `w` (0..255, but < 128 or |w - 128|-safe as
 * the callers arrange) with signed `x`, without VNNI: pairs to int16, then int32. */
static AVX2 __m256i dot_avx2(__m256i sum, __m256i w, __m256i x) {
    const __m256i pairs = _mm256_maddubs_epi16(w, x);
    return _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

static AVXVNNI __m256i dot_avxvnni(__m256i sum, __m256i w, __m256i x) {
    return _mm256_dpbusd_avx_epi32(sum, w, x);
}

/* The 256-bit tiles, once per dot product. `VNNI` says whether `DOT` takes unsigned
 * int8 weights whole (vpdpbusd) or only below 128 (vpmaddubsw, whose int16 pairs
 * saturate): int8 weights then take the sign of x instead (llama.cpp's trick). */
#define TILES_256(SUFFIX, ATTR, DOT, VNNI)                                                       \
    static ATTR void int4_tile_##SUFFIX(const Quantized *a, int64_t r0, const int rows,          \
                                        const uint8_t *w, int scale_format, float *out) {         \
        const int64_t groups = a->blocks, stride = int4_group_bytes(scale_format);               \
        const int offsets_held = scale_format != SCALES_F16;                                     \
        const int scale_width = offsets_held ? scale_format : 2;                                 \
        const __m256i low4 = _mm256_set1_epi8(0x0f);                                             \
        __m256 acc[MAX_ROWS][2];                                                                 \
        for (int r = 0; r < rows; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();              \
        for (int64_t g = 0; g < groups; ++g) {                                                   \
            const uint8_t *piece = w + g * stride;                                               \
            for (int l = 0; l < 5; ++l)                                                          \
                _mm_prefetch((const char *)(piece + 8 * stride + 64 * l), _MM_HINT_T0);          \
            for (int h = 0; h < 2; ++h) {                                                        \
                __m256i sum[MAX_ROWS];                                                           \
                for (int r = 0; r < rows; ++r) sum[r] = _mm256_setzero_si256();                  \
                for (int s = 0; s < 4; ++s) {                                                    \
                    const __m256i bytes =                                                        \
                        _mm256_loadu_si256((const __m256i *)(piece + 64 * s + 32 * h));          \
                    const __m256i lo = _mm256_and_si256(bytes, low4);                            \
                    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4);      \
                    for (int r = 0; r < rows; ++r) {                                             \
                        const int8_t *x = a->xq + (r0 + r) * groups * BLOCK + g * BLOCK;         \
                        sum[r] = DOT(sum[r], lo, _mm256_set1_epi32(load_i32(x + 4 * s)));        \
                        sum[r] = DOT(sum[r], hi, _mm256_set1_epi32(load_i32(x + 16 + 4 * s)));   \
                    }                                                                            \
                }                                                                                \
                const __m256 scales = load_scales256(piece + 256 + 8 * h * scale_width,          \
                                                     scale_format);                               \
                const __m256 offsets = offsets_held ? load_scales256(                            \
                    piece + 256 + 16 * scale_format + 8 * h * scale_format, scale_format)           \
                                                    : _mm256_setzero_ps();                       \
                for (int r = 0; r < rows; ++r) {                                                 \
                    const int64_t at = (r0 + r) * groups + g;                                    \
                    const float d = a->dx[at];                                                   \
                    const int32_t sx = a->sx[at];                                                \
                    const __m256i total = _mm256_sub_epi32(sum[r], _mm256_set1_epi32(8 * sx));   \
                    acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total),                       \
                                                _mm256_mul_ps(scales, _mm256_set1_ps(d)),        \
                                                acc[r][h]);                                      \
                    if (offsets_held)                                                            \
                        acc[r][h] = _mm256_fmadd_ps(offsets, _mm256_set1_ps(d * (float)sx),      \
                                                    acc[r][h]);                                  \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
        for (int r = 0; r < rows; ++r) {                                                         \
            _mm256_storeu_ps(out + r * TILE, acc[r][0]);                                         \
            _mm256_storeu_ps(out + r * TILE + 8, acc[r][1]);                                     \
        }                                                                                        \
    }                                                                                            \
                                                                                                 \
    static ATTR void int8_tile_##SUFFIX(const Quantized *a, int64_t r0, const int rows,          \
                                        const uint8_t *w, int scale_format, float *out) {         \
        const int64_t blocks = a->blocks, stride = int8_block_bytes(scale_format);              \
        const int in_blocks = scale_format == SCALES_F16;                                        \
        const __m256i flip = _mm256_set1_epi8((char)0x80);                                       \
        __m256 acc[MAX_ROWS][2];                                                                 \
        for (int r = 0; r < rows; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();              \
        for (int64_t b = 0; b < blocks; ++b) {                                                   \
            const uint8_t *piece = w + b * stride;                                               \
            for (int c = 0; c < 8; ++c)                                                          \
                _mm_prefetch((const char *)(piece + 4 * stride + 64 * c), _MM_HINT_T0);          \
            for (int h = 0; h < 2; ++h) {                                                        \
                __m256i sum[MAX_ROWS];                                                           \
                for (int r = 0; r < rows; ++r) sum[r] = _mm256_setzero_si256();                  \
                for (int c = 0; c < 8; ++c) {                                                    \
                    const __m256i bytes =                                                        \
                        _mm256_loadu_si256((const __m256i *)(piece + 64 * c + 32 * h));          \
                    /* q itself (signed), and |q| for the pair products */                       \
                    const __m256i q = _mm256_xor_si256(bytes, flip);                             \
                    const __m256i magnitude = _mm256_abs_epi8(q);                                \
                    for (int r = 0; r < rows; ++r) {                                             \
                        const int8_t *x = a->xq + (r0 + r) * blocks * BLOCK + b * BLOCK;         \
                        const __m256i xs = _mm256_set1_epi32(load_i32(x + 4 * c));               \
                        sum[r] = VNNI ? DOT(sum[r], bytes, xs)                                   \
                                      : DOT(sum[r], magnitude, _mm256_sign_epi8(xs, q));         \
                    }                                                                            \
                }                                                                                \
                const __m256 block_scales = in_blocks                                            \
                    ? load_scales256(piece + 512 + 16 * h, SCALES_F16) : _mm256_setzero_ps();     \
                for (int r = 0; r < rows; ++r) {                                                 \
                    const int64_t at = (r0 + r) * blocks + b;                                    \
                    const __m256i total =                                                        \
                        VNNI ? _mm256_sub_epi32(sum[r], _mm256_set1_epi32(128 * a->sx[at]))      \
                             : sum[r];                                                           \
                    const __m256 d = _mm256_set1_ps(a->dx[at]);                                  \
                    acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total),                       \
                                                in_blocks ? _mm256_mul_ps(block_scales, d) : d,  \
                                                acc[r][h]);                                      \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
        if (in_blocks) {                                                                         \
            for (int r = 0; r < rows; ++r) {                                                     \
                _mm256_storeu_ps(out + r * TILE, acc[r][0]);                                     \
                _mm256_storeu_ps(out + r * TILE + 8, acc[r][1]);                                 \
            }                                                                                    \
            return;                                                                              \
        }                                                                                        \
        const float *scales = (const float *)(w + blocks * 512);                                 \
        for (int r = 0; r < rows; ++r) {                                                         \
            _mm256_storeu_ps(out + r * TILE, _mm256_mul_ps(acc[r][0], _mm256_loadu_ps(scales))); \
            _mm256_storeu_ps(out + r * TILE + 8,                                                 \
                             _mm256_mul_ps(acc[r][1], _mm256_loadu_ps(scales + 8)));             \
        }                                                                                        \
    }

TILES_256(avx2, AVX2, dot_avx2, 0)
TILES_256(avxvnni, AVXVNNI, dot_avxvnni, 1)

/* Non-inlined entry points per level, each with a constant row count per call. */
#define ENTRY(SUFFIX, TARGET)                                                                    \
    __attribute__((target(TARGET))) static void int4_rows_##SUFFIX(                             \
        const Quantized *a, int64_t r0, int rows, const uint8_t *w, int sb, float *out) {        \
        switch (rows) {                                                                          \
            case 1: int4_tile_##SUFFIX(a, r0, 1, w, sb, out); break;                             \
            case 2: int4_tile_##SUFFIX(a, r0, 2, w, sb, out); break;                             \
            case 3: int4_tile_##SUFFIX(a, r0, 3, w, sb, out); break;                             \
            case 4: int4_tile_##SUFFIX(a, r0, 4, w, sb, out); break;                             \
            case 5: int4_tile_##SUFFIX(a, r0, 5, w, sb, out); break;                             \
            case 6: int4_tile_##SUFFIX(a, r0, 6, w, sb, out); break;                             \
            case 7: int4_tile_##SUFFIX(a, r0, 7, w, sb, out); break;                             \
            default: int4_tile_##SUFFIX(a, r0, 8, w, sb, out); break;                            \
        }                                                                                        \
    }                                                                                            \
    __attribute__((target(TARGET))) static void int8_rows_##SUFFIX(                             \
        const Quantized *a, int64_t r0, int rows, const uint8_t *w, int sb, float *out) {        \
        switch (rows) {                                                                          \
            case 1: int8_tile_##SUFFIX(a, r0, 1, w, sb, out); break;                             \
            case 2: int8_tile_##SUFFIX(a, r0, 2, w, sb, out); break;                             \
            case 3: int8_tile_##SUFFIX(a, r0, 3, w, sb, out); break;                             \
            case 4: int8_tile_##SUFFIX(a, r0, 4, w, sb, out); break;                             \
            case 5: int8_tile_##SUFFIX(a, r0, 5, w, sb, out); break;                             \
            case 6: int8_tile_##SUFFIX(a, r0, 6, w, sb, out); break;                             \
            case 7: int8_tile_##SUFFIX(a, r0, 7, w, sb, out); break;                             \
            default: int8_tile_##SUFFIX(a, r0, 8, w, sb, out); break;                            \
        }                                                                                        \
    }

ENTRY(512, "avx512f,avx512bw,avx512vl,avx512vnni")
ENTRY(avxvnni, "avx2,fma,f16c,avxvnni")
ENTRY(avx2, "avx2,fma,f16c")
#endif

/* One tile for rows r0 .. r0 + rows - 1 (rows <= MAX_ROWS) at `level`. */
static void tile(int bits, int level, const Quantized *a, int64_t r0, int rows, const uint8_t *w,
                 int scale_format, float *out) {
#if X86
    if (level == LEVEL_AVX512VNNI) {
        if (bits == 4) int4_rows_512(a, r0, rows, w, scale_format, out);
        else int8_rows_512(a, r0, rows, w, scale_format, out);
        return;
    }
    if (level == LEVEL_AVXVNNI) {
        if (bits == 4) int4_rows_avxvnni(a, r0, rows, w, scale_format, out);
        else int8_rows_avxvnni(a, r0, rows, w, scale_format, out);
        return;
    }
    if (level == LEVEL_AVX2) {
        if (bits == 4) int4_rows_avx2(a, r0, rows, w, scale_format, out);
        else int8_rows_avx2(a, r0, rows, w, scale_format, out);
        return;
    }
#else
    (void)level;
#endif
    if (bits == 4) int4_tile_scalar(a, r0, rows, w, scale_format, out);
    else int8_tile_scalar(a, r0, rows, w, scale_format, out);
}

/* y [m, out] (bfloat16 if y_bf16, else float32) = x [m, k] (bfloat16 if x_bf16) times
 * the packed weight's transpose. `bits` 4 (k a multiple of 32, `scale_format` one of the
 * SCALES_ formats) or 8 (`scale_format` 4, a scale a row, or SCALES_F16, a scale a
 * block, k a multiple of 32); `level` is capped at the best this CPU runs. Returns 0, 1 for arguments it
 * does not take, 2 when scratch memory ran out. Runs to completion once called. */
int int8_dot(int bits, const void *x, int x_bf16, int64_t m, int64_t k, const uint8_t *w,
             int64_t out, int scale_format, void *y, int y_bf16, int level, int num_threads) {
    if (m < 1 || k < 1 || out < 1 || (bits != 4 && bits != 8)) return 1;
    if (bits == 4 && (k % BLOCK || !int4_format_known(scale_format))) return 1;
    if (bits == 8 && (!int8_format_known(scale_format) || (scale_format == SCALES_F16 && k % BLOCK)))
        return 1;
    const int best = int8_dot_best_level();
    if (level > best) level = best;
    Quantized a;
    if (quantize(x, x_bf16, m, k, level, &a)) return 2;
    const int64_t tiles = (out + TILE - 1) / TILE;
    const int64_t tile_bytes = bits == 4 ? int4_tile_bytes(k, scale_format) : int8_tile_bytes(k, scale_format);
#pragma omp parallel num_threads(num_threads)
    {
        int64_t t, end;
        thread_rows(tiles, &t, &end);
        float acc[MAX_ROWS * TILE];
        for (; t < end; ++t) {
            const int valid = out - t * TILE < TILE ? (int)(out - t * TILE) : TILE;
            for (int64_t r0 = 0; r0 < m; r0 += MAX_ROWS) {
                const int rows = m - r0 < MAX_ROWS ? (int)(m - r0) : MAX_ROWS;
                tile(bits, level, &a, r0, rows, w + t * tile_bytes, scale_format, acc);
                store_tile(acc, rows, valid, y, y_bf16, out, r0, t * TILE);
            }
        }
    }
    release(&a);
    return 0;
}

/* ---- the weight's values back ------------------------------------------------------ */

/* float32 -> bfloat16 as `float_to_bf16`, without its branch, so loops vectorize. */
static inline uint16_t to_bf16_lanes(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const uint32_t nan = (bits >> 16) | 0x40u;
    return (uint16_t)((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

/* One tile's values into y's rows `[rows, k]` (the tile's rows first .. first +
 * rows - 1 of 16),
 * float32 or bfloat16 (rounded to nearest even once, from the float32 value).
 * int4: (q - 8) * scale + offset, int8: q * scale, each product and sum rounded to
 * float32 on its own (this file builds with -std=c11, which keeps a * b + c two
 * operations), so the values are those `Int4Weight.quantize` and
 * `Int8Weight.quantize` compute. Each 64-byte piece (4 inputs of the 16 rows) is
 * converted whole, its lanes' scales repeated, then its rows' 4 values stored. */
static void unpack_tile(int bits, const uint8_t *w, int64_t k, int scale_format, int first,
                        int rows, void *y, int y_bf16) {
    float scale[64], offset[64], lo[64], hi[64];
    uint16_t lo16[64], hi16[64];
    const int64_t blocks = (k + BLOCK - 1) / BLOCK;
    const int64_t stride = bits == 4 ? int4_group_bytes(scale_format) : int8_block_bytes(scale_format);
    if (bits == 8 && scale_format != SCALES_F16) {
        const uint8_t *scales = w + blocks * 512;
        for (int i = 0; i < 64; ++i) scale[i] = scale_at(scales, i / 4, 4);
    }
    for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t *piece = w + b * stride;
        if (bits == 8 && scale_format == SCALES_F16)
            for (int i = 0; i < 64; ++i) scale[i] = scale_at(piece + 512, i / 4, SCALES_F16);
        if (bits == 4) {
            for (int i = 0; i < 64; ++i) {
                scale[i] = scale_at(piece + 256, i / 4, scale_format);
                offset[i] = scale_format == SCALES_F16
                                ? 0.0f
                                : scale_at(piece + 256 + 16 * scale_format, i / 4, scale_format);
            }
        }
        const int pieces = bits == 4 ? 4 : 8;
        for (int s = 0; s < pieces; ++s) {
            const uint8_t *bytes = piece + 64 * s;
            /* columns of this piece's low values (and, int4, its high ones) */
            const int64_t col = b * BLOCK + 4 * s, col_hi = b * BLOCK + 16 + 4 * s;
            if (bits == 4) {
                for (int i = 0; i < 64; ++i) {
                    lo[i] = (float)((int)(bytes[i] & 15) - 8) * scale[i] + offset[i];
                    hi[i] = (float)((int)(bytes[i] >> 4) - 8) * scale[i] + offset[i];
                }
            } else {
                for (int i = 0; i < 64; ++i) lo[i] = (float)((int)bytes[i] - 128) * scale[i];
            }
            const int valid = col >= k ? 0 : k - col < 4 ? (int)(k - col) : 4;
            if (y_bf16) {
                for (int i = 0; i < 64; ++i) lo16[i] = to_bf16_lanes(lo[i]);
                if (bits == 4)
                    for (int i = 0; i < 64; ++i) hi16[i] = to_bf16_lanes(hi[i]);
                for (int r = 0; r < rows; ++r) {
                    uint16_t *out = (uint16_t *)y + r * k;
                    memcpy(out + col, lo16 + 4 * (first + r), 2 * (size_t)valid);
                    if (bits == 4) memcpy(out + col_hi, hi16 + 4 * (first + r), 8);
                }
            } else {
                for (int r = 0; r < rows; ++r) {
                    float *out = (float *)y + r * k;
                    memcpy(out + col, lo + 4 * (first + r), 4 * (size_t)valid);
                    if (bits == 4) memcpy(out + col_hi, hi + 4 * (first + r), 16);
                }
            }
        }
    }
}

#if X86
/* float32 -> bfloat16 of 16 lanes as `to_bf16_lanes` does each. */
static AVX512 __m256i bf16_lanes_512(__m512 v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)),
                                                   _mm512_set1_epi32(0x7f800000));
    rounded = _mm512_mask_mov_epi32(rounded, nan,
                                    _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(rounded);
}

/* `unpack_tile` for int4 with AVX512: a group's four pieces are transposed so each
 * row's 16 code bytes lie together, then 16 values at a time, the same arithmetic
 * (a product and a sum, each rounded on its own) and the same rounding. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) static void unpack_int4_tile_512(
    const uint8_t *w, int64_t k, int scale_format, int first, int rows, void *y, int y_bf16) {
    const int64_t groups = k / BLOCK, stride = int4_group_bytes(scale_format);
    const __m512i low4 = _mm512_set1_epi32(15);
    const __m512 eight = _mm512_set1_ps(8.0f);
    uint8_t by_row[256] __attribute__((aligned(64)));
    for (int64_t g = 0; g < groups; ++g) {
        const uint8_t *piece = w + g * stride;
        const __m512i p0 = _mm512_loadu_si512(piece), p1 = _mm512_loadu_si512(piece + 64);
        const __m512i p2 = _mm512_loadu_si512(piece + 128), p3 = _mm512_loadu_si512(piece + 192);
        const __m512i t0 = _mm512_unpacklo_epi32(p0, p1), t1 = _mm512_unpackhi_epi32(p0, p1);
        const __m512i t2 = _mm512_unpacklo_epi32(p2, p3), t3 = _mm512_unpackhi_epi32(p2, p3);
        /* by_row[64 i + 16 L ..] holds row 4 L + i's 16 bytes */
        _mm512_store_si512(by_row, _mm512_unpacklo_epi64(t0, t2));
        _mm512_store_si512(by_row + 64, _mm512_unpackhi_epi64(t0, t2));
        _mm512_store_si512(by_row + 128, _mm512_unpacklo_epi64(t1, t3));
        _mm512_store_si512(by_row + 192, _mm512_unpackhi_epi64(t1, t3));
        const uint8_t *scales = piece + 256, *offsets = scales + 16 * scale_format;
        for (int r = first; r < first + rows; ++r) {
            const __m512i bytes = _mm512_cvtepu8_epi32(
                _mm_load_si128((const __m128i *)(by_row + 64 * (r & 3) + 16 * (r >> 2))));
            const __m512 scale = _mm512_set1_ps(scale_at(scales, r, scale_format));
            const __m512 offset =
                _mm512_set1_ps(scale_format == SCALES_F16 ? 0.0f : scale_at(offsets, r, scale_format));
            const __m512 lo = _mm512_add_ps(
                _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_and_si512(bytes, low4)), eight), scale),
                offset);
            const __m512 hi = _mm512_add_ps(
                _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(bytes, 4)), eight), scale),
                offset);
            if (y_bf16) {
                uint16_t *out = (uint16_t *)y + (r - first) * k + g * BLOCK;
                _mm256_storeu_si256((__m256i *)out, bf16_lanes_512(lo));
                _mm256_storeu_si256((__m256i *)(out + 16), bf16_lanes_512(hi));
            } else {
                float *out = (float *)y + (r - first) * k + g * BLOCK;
                _mm512_storeu_ps(out, lo);
                _mm512_storeu_ps(out + 16, hi);
            }
        }
    }
}
#endif

/* `unpack_tile`, on AVX512 where this CPU has it (`level` 3). */
static void unpack_tile_at(int level, int bits, const uint8_t *w, int64_t k, int scale_format,
                           int first, int rows, void *y, int y_bf16) {
#if X86
    if (level == LEVEL_AVX512VNNI && bits == 4) {
        unpack_int4_tile_512(w, k, scale_format, first, rows, y, y_bf16);
        return;
    }
#else
    (void)level;
#endif
    unpack_tile(bits, w, k, scale_format, first, rows, y, y_bf16);
}

/* y [rows, k] = the values of output rows row0 .. row0 + rows - 1 of the packed
 * weight (`out` rows in all; row0 a multiple of TILE). Returns 0, or 1 for arguments
 * it does not take. Runs to completion once called. */
int int8_dot_unpack(int bits, const uint8_t *w, int64_t out, int64_t k, int scale_format,
                    int64_t row0, int64_t rows, void *y, int y_bf16, int level, int num_threads) {
    if (level > int8_dot_best_level()) level = int8_dot_best_level();
    if (k < 1 || out < 1 || rows < 0 || row0 < 0 || row0 % TILE || row0 + rows > out) return 1;
    if (bits != 4 && bits != 8) return 1;
    if (bits == 4 && (k % BLOCK || !int4_format_known(scale_format))) return 1;
    if (bits == 8 && (!int8_format_known(scale_format) || (scale_format == SCALES_F16 && k % BLOCK)))
        return 1;
    const int64_t tile_bytes = bits == 4 ? int4_tile_bytes(k, scale_format) : int8_tile_bytes(k, scale_format);
    const int64_t first = row0 / TILE, tiles = (rows + TILE - 1) / TILE;
    const size_t value_bytes = y_bf16 ? 2 : 4;
#pragma omp parallel num_threads(num_threads)
    {
        int64_t t, end;
        thread_rows(tiles, &t, &end);
        for (; t < end; ++t) {
            const int64_t start = t * TILE;
            const int count = rows - start < TILE ? (int)(rows - start) : TILE;
            unpack_tile_at(level, bits, w + (first + t) * tile_bytes, k, scale_format, 0, count,
                           (char *)y + (size_t)(start * k) * value_bytes, y_bf16);
        }
    }
    return 0;
}

/* y [n, k] = the values of output rows ids[0 .. n - 1] (each in 0 .. out - 1: an
 * embedding lookup in a tied head's tiles). Returns 0, or 1 for arguments it does
 * not take (an id out of range included). Runs to completion once called. */
int int8_dot_unpack_rows(int bits, const uint8_t *w, int64_t out, int64_t k, int scale_format,
                         const int64_t *ids, int64_t n, void *y, int y_bf16, int level,
                         int num_threads) {
    if (level > int8_dot_best_level()) level = int8_dot_best_level();
    if (k < 1 || out < 1 || n < 0 || (bits != 4 && bits != 8)) return 1;
    if (bits == 4 && (k % BLOCK || !int4_format_known(scale_format))) return 1;
    if (bits == 8 && (!int8_format_known(scale_format) || (scale_format == SCALES_F16 && k % BLOCK)))
        return 1;
    for (int64_t i = 0; i < n; ++i)
        if (ids[i] < 0 || ids[i] >= out) return 1;
    const int64_t tile_bytes = bits == 4 ? int4_tile_bytes(k, scale_format) : int8_tile_bytes(k, scale_format);
    const size_t value_bytes = y_bf16 ? 2 : 4;
#pragma omp parallel num_threads(n > 1 ? num_threads : 1)
    {
        int64_t i, end;
        thread_rows(n, &i, &end);
        for (; i < end; ++i)
            unpack_tile_at(level, bits, w + (ids[i] / TILE) * tile_bytes, k, scale_format,
                           (int)(ids[i] % TILE), 1, (char *)y + (size_t)(i * k) * value_bytes, y_bf16);
    }
    return 0;
}

/* ---- GGUF's 4-bit blocks straight into tiles --------------------------------------- */

static inline void put_scale(uint8_t *p, int i, float value, int scale_format) {
    if (scale_format == SCALES_BF16) {
        const uint16_t h = float_to_bf16(value);
        memcpy(p + 2 * i, &h, 2);
    } else {
        memcpy(p + 4 * i, &value, 4);
    }
}

/* A Q4_K block's group g of 32 (0..7) as a tile piece's 16 code bytes (weight j
 * in the low nibble of byte j, j + 16 in its high one), its scale d sc and its
 * offset 8 d sc - dmin m, as `block_codes.int4_blocks` computes them: the
 * group's codes are the low (even g) or high (odd g) nibbles of the block's
 * 32-byte run g / 2, its 6-bit sc and m ggml's get_scale_min_k4. */
static void q4_k_group(const uint8_t *block, int g, uint8_t *codes, float *scale, float *offset) {
    uint16_t h;
    memcpy(&h, block, 2);
    const float d = half_to_float(h);
    memcpy(&h, block + 2, 2);
    const float dmin = half_to_float(h);
    const uint8_t *packed = block + 4;
    const int sc = g < 4 ? packed[g] & 63 : (packed[g + 4] & 0xF) | ((packed[g - 4] >> 6) << 4);
    const int m = g < 4 ? packed[g + 4] & 63 : (packed[g + 4] >> 4) | ((packed[g] >> 6) << 4);
    const uint8_t *run = block + 16 + 32 * (g / 2);
    const int shift = 4 * (g & 1);
    for (int j = 0; j < 16; ++j)
        codes[j] = (uint8_t)(((run[j] >> shift) & 0xF) | (((run[j + 16] >> shift) & 0xF) << 4));
    *scale = d * (float)sc;
    const float minimum = dmin * (float)m;
    *offset = 8.0f * *scale - minimum;
}

/* The int4 tiles (`pack_int4_tiles`' layout) of `rows` rows of k weights, row r
 * stored at address rows_at[r] as GGUF blocks of type kinds[r] (0: Q4_0, 18 bytes a
 * block of 32, w = (q - 8) d; 1: Q4_1, 20 bytes, w = q d + m; 2: Q4_K, 144 bytes a
 * block of 256, k a multiple of 256: `q4_k_group`). Each tile piece takes a
 * group's codes as they are; the scale is d and the offset 0 (Q4_0) or m + 8 d in
 * float32 (Q4_1), rounded to bfloat16 (SCALES_BF16) or kept in float32
 * (SCALES_F32); in SCALES_F16, which takes Q4_0 rows only, the scale is d's own
 * 2 bytes. Rows past the last of a tile are zeros. Returns 0, or 1 for arguments
 * it does not take. Runs to completion once called. */
int int8_dot_pack_q4(const int64_t *rows_at, const uint8_t *kinds, int64_t rows, int64_t k,
                     int scale_format, uint8_t *out, int num_threads) {
    if (rows < 1 || k < BLOCK || k % BLOCK || !int4_format_known(scale_format)) return 1;
    for (int64_t r = 0; r < rows; ++r)
        if (kinds[r] > 2 || rows_at[r] == 0 || (kinds[r] == 2 && k % 256) ||
            (scale_format == SCALES_F16 && kinds[r] != 0))
            return 1;
    const int64_t groups = k / BLOCK, stride = int4_group_bytes(scale_format);
    const int64_t tiles = (rows + TILE - 1) / TILE, tile_bytes = groups * stride;
#pragma omp parallel num_threads(num_threads)
    {
        int64_t t, end;
        thread_rows(tiles, &t, &end);
        for (; t < end; ++t) {
            uint8_t *tile = out + t * tile_bytes;
            memset(tile, 0, (size_t)tile_bytes);
            const int valid = rows - t * TILE < TILE ? (int)(rows - t * TILE) : TILE;
            for (int r = 0; r < valid; ++r) {
                const uint8_t *row = (const uint8_t *)(intptr_t)rows_at[t * TILE + r];
                if (kinds[t * TILE + r] == 2) {
                    for (int64_t g = 0; g < groups; ++g) {
                        uint8_t codes[16];
                        float scale, offset;
                        q4_k_group(row + (g / 8) * 144, (int)(g % 8), codes, &scale, &offset);
                        uint8_t *piece = tile + g * stride;
                        for (int s = 0; s < 4; ++s) memcpy(piece + 64 * s + 4 * r, codes + 4 * s, 4);
                        put_scale(piece + 256, r, scale, scale_format);
                        put_scale(piece + 256 + 16 * scale_format, r, offset, scale_format);
                    }
                    continue;
                }
                const int q4_1 = kinds[t * TILE + r];
                const int64_t block_bytes = q4_1 ? 20 : 18;
                for (int64_t g = 0; g < groups; ++g) {
                    const uint8_t *block = row + g * block_bytes;
                    uint16_t h;
                    memcpy(&h, block, 2);
                    const float d = half_to_float(h);
                    float offset = 0.0f;
                    if (q4_1) {
                        memcpy(&h, block + 2, 2);
                        offset = half_to_float(h) + 8.0f * d;
                    }
                    const uint8_t *codes = block + (q4_1 ? 4 : 2);
                    uint8_t *piece = tile + g * stride;
                    for (int s = 0; s < 4; ++s) memcpy(piece + 64 * s + 4 * r, codes + 4 * s, 4);
                    if (scale_format == SCALES_F16) {
                        memcpy(piece + 256 + 2 * r, block, 2);
                        continue;
                    }
                    put_scale(piece + 256, r, d, scale_format);
                    put_scale(piece + 256 + 16 * scale_format, r, offset, scale_format);
                }
            }
        }
    }
    return 0;
}

/* Symmetric int8 per row, as `linear.Int8Weight.quantize` computes it in torch:
 * each row's largest |w| / 127 rounded to the weight's type (`w_bf16`: bfloat16,
 * else float32) and never below that type's smallest normal, then every weight
 * divided by that scale in float32, rounded half to even and clamped to
 * -127..127. `w` [rows, k]; `q` [rows, k]; `scales` [rows] in the weight's type.
 * Rows run in parallel on torch's OpenMP pool. */
void int8_dot_quantize_rows(const void *w, int w_bf16, int64_t rows, int64_t k, int8_t *q,
                            void *scales, int num_threads) {
    const float tiny = 1.17549435e-38f; /* FLT_MIN, also bfloat16's smallest normal */
#pragma omp parallel for num_threads(num_threads) schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; ++r) {
        const uint16_t *wb = (const uint16_t *)w + r * k;
        const float *wf = (const float *)w + r * k;
        float absmax = 0.0f;
        if (w_bf16) {
#pragma omp simd reduction(max : absmax)
            for (int64_t j = 0; j < k; ++j) absmax = fmaxf(absmax, fabsf(bf16_to_float(wb[j])));
        } else {
#pragma omp simd reduction(max : absmax)
            for (int64_t j = 0; j < k; ++j) absmax = fmaxf(absmax, fabsf(wf[j]));
        }
        float scale = absmax / 127.0f;
        if (w_bf16) {
            const uint16_t rounded = float_to_bf16(scale);
            scale = bf16_to_float(rounded) < tiny ? tiny : bf16_to_float(rounded);
            ((uint16_t *)scales)[r] = float_to_bf16(scale);
        } else {
            scale = scale < tiny ? tiny : scale;
            ((float *)scales)[r] = scale;
        }
        int8_t *out = q + r * k;
#pragma omp simd
        for (int64_t j = 0; j < k; ++j) {
            const float v = (w_bf16 ? bf16_to_float(wb[j]) : wf[j]) / scale;
            const float c = nearbyintf(v);
            out[j] = (int8_t)(c > 127.0f ? 127.0f : c < -127.0f ? -127.0f : c);
        }
    }
}

/* `pack_int8_tiles`' layout of the int8 weight q [rows, k] (-127..127) with row
 * scales `scales` [rows] (float32): per tile of 16 rows, for each block of 32
 * inputs its 8 pieces of 4 bytes, each piece the 16 rows' bytes q + 128, then the
 * tile's 16 scales; inputs past k are the unsigned 128 (zero), rows past the last
 * are 128 with scale 0. `out` holds int8_tile_bytes(k, 4) a tile. */
void int8_dot_pack_int8(const int8_t *q, const float *scales, int64_t rows, int64_t k,
                        uint8_t *out, int num_threads) {
    const int64_t blocks = (k + BLOCK - 1) / BLOCK, tile_bytes = int8_tile_bytes(k, 4);
    const int64_t tiles = (rows + TILE - 1) / TILE;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (tiles > 1)
    for (int64_t t = 0; t < tiles; ++t) {
        uint8_t *tile = out + t * tile_bytes;
        memset(tile, 128, (size_t)(blocks * 512));
        float *tile_scales = (float *)(tile + blocks * 512);
        for (int r = 0; r < TILE; ++r) {
            const int64_t row = t * TILE + r;
            if (row >= rows) {
                tile_scales[r] = 0.0f;
                continue;
            }
            tile_scales[r] = scales[row];
            const int8_t *src = q + row * k;
            for (int64_t j = 0; j < k; ++j) {
                const int64_t b = j / BLOCK, p = (j % BLOCK) / 4;
                tile[((b * 8 + p) * TILE + r) * 4 + j % 4] = (uint8_t)(src[j] + 128);
            }
        }
    }
}
