/* The elementwise parts of a decoder layer, each one pass instead of the several
 * torch ops (and temporaries) they replace, for bfloat16 (`_bf16`) and float32
 * (`_f32`) tensors:
 *   rms_norm      out = x / rms(x) * weight
 *   add_rms_norm  residual += delta (rounded to the element type, as torch's add
 *                 does), then out = rms_norm(residual)
 *   silu_mul      out = silu(gate) * up for gate_up = [gate | up] per row
 *   rope_cache    rotary embedding of q and k in a fused qkv row, with the rotated
 *                 k and the v stored in the paged KV cache
 * Arithmetic is float32 and each output is rounded to the element type once (in
 * bfloat16 the RoPE products round where torch's ops round, see `rope_head`). Rows
 * run in parallel on torch's OpenMP pool when there are enough of them to pay for
 * it. Tensors are contiguous [rows, dim]; bfloat16 is passed as uint16_t bit
 * patterns. The kernels are written once, in layer_ops_impl.h, over the element
 * type. The float32 ones sum in another order than torch's ops, so they serve
 * models whose outputs need not match transformers bit for bit (quantized ones).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16_math.h"

#define T uint16_t
#define LOAD(v) bf16_to_float(v)
#define STORE(f) float_to_bf16(f)
#define ROUND(f) bf16_to_float(float_to_bf16(f))
#define NAME(op) op##_bf16
#include "layer_ops_impl.h"

#define T float
#define LOAD(v) (v)
#define STORE(f) (f)
#define ROUND(f) (f)
#define NAME(op) op##_f32
#include "layer_ops_impl.h"
