/* One sequence's decode step through every decoder layer, in one call, for models
 * whose four projections per layer are int4 or int8: bfloat16 ones on the AVX512-BF16
 * kernels (int4_matvec_bf16, int8_matvec_bf16), float32 ones on the AVX2 kernels
 * (int4_matmul_f32, int8_matmul_f32 at one row); or, for weights packed in
 * int8_dot.c's tiles (`bits` with TILED set), either dtype on int8_dot.
 *
 * At batch 1 the Python layer loop (about 10 kernel calls per layer, each with its
 * argument checks and a tensor allocation) was a fifth of a bfloat16 int4 step, and
 * it held the GIL the event loop also needs. This runs the same
 * kernels in the same order on the same values, so it gives the Python path's
 * results bit for bit (tests/runner/test_native_decode_one.py). The step is written
 * once, in decode_one_impl.h, over the element type.
 *
 * The kernels are compiled into this library from their own sources.
 */
#include <stdint.h>
#include <stdlib.h>

#include "int8_dot.c"
#include "quantized_matvec.c"
#include "quantized_matmul_f32.c"
#include "layer_ops.c"
#include "paged_decode.c"

/* The pointers of one layer, in this order, as int64 (see `decode_one.py`). Each
 * projection has its weight, its int8 row scales (0 for int4 and for tiles), its
 * bias (0 for none) and its bits: 4 or 8, plus TILED for int8_dot.c's tiles, whose
 * int4 scale format (SCALES_) is that word shifted left by 8. A layer may mix
 * them: a GGUF keeps some projections at more bits than others. */
/* Set in a projection's bits when it is int8_dot.c's tiles. */
#define TILED 16

enum {
    INPUT_NORM,
    POST_NORM,
    QKV,
    O = QKV + 4,
    GATE_UP = O + 4,
    DOWN = GATE_UP + 4,
    K_CACHE = DOWN + 4,
    V_CACHE,
    K_SCALES, /* a quantized cache's scales (paged_decode.c's CACHE_INT8 or _FP8), else 0 */
    V_SCALES,
    POINTERS_PER_LAYER
};


#define T uint16_t
#define LOAD(v) bf16_to_float(v)
#define STORE(f) float_to_bf16(f)
#define NAME(op) op##_bf16
#define INT4_MATVEC(x, in, w, out, y, threads) int4_matvec_bf16(x, in, w, out, y, threads)
#define INT8_MATVEC(x, in, q, scales, out, y, threads) \
    int8_matvec_bf16(x, in, q, scales, out, y, threads)
#include "decode_one_impl.h"

#define T float
#define LOAD(v) (v)
#define STORE(f) (f)
#define NAME(op) op##_f32
#define INT4_MATVEC(x, in, w, out, y, threads) int4_matmul_f32(x, 1, in, w, out, y, threads)
#define INT8_MATVEC(x, in, q, scales, out, y, threads) \
    int8_matmul_f32(x, 1, in, q, scales, out, y, threads)
#include "decode_one_impl.h"
