/* One sequence's decode step through every decoder layer, in one call, for bfloat16
 * models whose four projections per layer are int4 (packed for int4_matvec) or int8
 * (for int8_matvec).
 *
 * At batch 1 the Python layer loop (about 10 kernel calls per layer, each with its
 * argument checks and a tensor allocation) cost about 1.3 ms of a 6.3 ms int4 step,
 * and it held the GIL the event loop also needs. This runs the same kernels in the
 * same order on the same values, so it gives the Python path's results bit for bit
 * (tests/runner/test_native_decode_one.py).
 *
 * The kernels are compiled into this library from their own sources.
 */
#include <stdint.h>
#include <stdlib.h>

#include "quantized_matvec.c"
#include "layer_ops.c"
#include "paged_decode.c"

/* The pointers of one layer, in this order, as int64 (see `decode_one.py`). Each
 * projection has its weight, its int8 row scales (0 for int4) and its bias (0 for
 * none). */
enum {
    INPUT_NORM,
    POST_NORM,
    QKV,
    O = QKV + 3,
    GATE_UP = O + 3,
    DOWN = GATE_UP + 3,
    K_CACHE = DOWN + 3,
    V_CACHE,
    POINTERS_PER_LAYER
};

/* y += bias (both bfloat16, rounded once like torch's add); no bias: nothing. */
static void add_bias(uint16_t *y, const uint16_t *bias, int64_t n) {
    if (bias == NULL) return;
    for (int64_t i = 0; i < n; ++i) y[i] = float_to_bf16(bf16_to_float(y[i]) + bf16_to_float(bias[i]));
}

static int matvec(int bits, const uint16_t *x, int64_t in, const int64_t *layer, int which,
                  int64_t out, uint16_t *y, int num_threads) {
    const int status =
        bits == 4
            ? int4_matvec_bf16(x, in, (const uint8_t *)(intptr_t)layer[which], out, y,
                               num_threads)
            : int8_matvec_bf16(x, in, (const int8_t *)(intptr_t)layer[which],
                               (const uint16_t *)(intptr_t)layer[which + 1], out, y, num_threads);
    add_bias(y, (const uint16_t *)(intptr_t)layer[which + 2], out);
    return status;
}

/* `hidden` [hidden_size]: the token's embedding in, the residual stream after the
 * last layer out (before the final norm). `layers` [num_layers, POINTERS_PER_LAYER];
 * `bits` 4 or 8, the projections' quantization.
 * `cos`, `sin` [head_dim] (sin's first half negated); `slot` where this token's k/v
 * go; `table` [max_blocks] and `seq_len` its context after this token. Returns 0, 1
 * for shapes the kernels do not take, 2 when memory ran out, 3 for a slot outside
 * the cache, 4 for a context longer than its table. */
int decode_one_bf16(uint16_t *hidden, const int64_t *layers, int64_t num_layers, int bits,
                    int64_t hidden_size, int64_t num_heads, int64_t num_kv_heads,
                    int64_t head_dim, int64_t intermediate, const uint16_t *cos,
                    const uint16_t *sin, const int64_t *slot, int64_t num_slots,
                    const int32_t *table, int64_t max_blocks, const int32_t *seq_len,
                    int64_t block_size, float scale, float eps, int num_threads) {
    if (bits != 4 && bits != 8) return 1;
    if (*seq_len < 1 || *seq_len > max_blocks * block_size) return 4;
    const int64_t q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
    const int64_t qkv_size = q_size + 2 * kv_size;
    /* x, qkv, q, attention, projection, gate_up, activation */
    const int64_t floats = hidden_size + qkv_size + 2 * q_size + hidden_size + 3 * intermediate;
    uint16_t *buffer = malloc(sizeof(uint16_t) * (size_t)floats);
    if (buffer == NULL) return 2;
    uint16_t *x = buffer, *qkv = x + hidden_size, *q = qkv + qkv_size, *attn = q + q_size;
    uint16_t *proj = attn + q_size, *gate_up = proj + hidden_size, *act = gate_up + 2 * intermediate;
    int status = 0;
    rms_norm_bf16(hidden, (const uint16_t *)(intptr_t)layers[INPUT_NORM], x, 1, hidden_size, eps,
                  num_threads);
    for (int64_t i = 0; i < num_layers && status == 0; ++i) {
        const int64_t *layer = layers + i * POINTERS_PER_LAYER;
        uint16_t *k_cache = (uint16_t *)(intptr_t)layer[K_CACHE];
        uint16_t *v_cache = (uint16_t *)(intptr_t)layer[V_CACHE];
        if ((status = matvec(bits, x, hidden_size, layer, QKV, qkv_size, qkv, num_threads))) break;
        const int rope = rope_cache_bf16(qkv, cos, sin, slot, q, k_cache, v_cache, 1, num_heads,
                                         num_kv_heads, head_dim, num_slots, num_threads);
        if (rope) {
            status = rope == 2 ? 3 : 1;
            break;
        }
        if ((status = paged_decode(q, k_cache, v_cache, table, max_blocks, seq_len, attn, 1,
                                   num_heads, num_kv_heads, head_dim, block_size, scale,
                                   num_threads, 0, 0)))
            break;
        if ((status = matvec(bits, attn, q_size, layer, O, hidden_size, proj, num_threads))) break;
        add_rms_norm_bf16(hidden, proj, (const uint16_t *)(intptr_t)layer[POST_NORM], x, 1,
                          hidden_size, eps, num_threads);
        if ((status = matvec(bits, x, hidden_size, layer, GATE_UP, 2 * intermediate, gate_up,
                             num_threads)))
            break;
        silu_mul_bf16(gate_up, act, 1, intermediate, num_threads);
        if ((status = matvec(bits, act, intermediate, layer, DOWN, hidden_size, proj, num_threads)))
            break;
        if (i + 1 < num_layers) {
            add_rms_norm_bf16(hidden, proj, (const uint16_t *)(intptr_t)layer[POINTERS_PER_LAYER + INPUT_NORM], x, 1,
                              hidden_size, eps, num_threads);
        } else {
            for (int64_t d = 0; d < hidden_size; ++d)
                hidden[d] = float_to_bf16(bf16_to_float(hidden[d]) + bf16_to_float(proj[d]));
        }
    }
    free(buffer);
    return status;
}
