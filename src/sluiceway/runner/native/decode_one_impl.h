/* decode_one.c's step over one element type, included once per type. Before
 * including, define T, LOAD, STORE and NAME as for layer_ops_impl.h, and
 *   INT4_MATVEC(x, in, w, out, y, threads)          one row through an int4 weight
 *   INT8_MATVEC(x, in, q, scales, out, y, threads)  one row through an int8 weight
 * with the kernels' return codes. No include guard: it is meant to be included more
 * than once; it undefines its parameters at its end.
 */

/* y += bias (rounded once to T, like torch's add); no bias: nothing. */
static void NAME(add_bias)(T *y, const T *bias, int64_t n) {
    if (bias == NULL) return;
    for (int64_t i = 0; i < n; ++i) y[i] = STORE(LOAD(y[i]) + LOAD(bias[i]));
}

static int NAME(matvec)(const T *x, int64_t in, const int64_t *layer, int which,
                        int64_t out, T *y, int level, int num_threads) {
    const int is_bf16 = sizeof(T) == 2;
    const int bits = (int)layer[which + 3] & 0xff, scale_format = (int)layer[which + 3] >> 8;
    if ((bits & ~TILED) != 4 && (bits & ~TILED) != 8) return 1;
    const int status =
        bits & TILED ? int8_dot(bits & ~TILED, x, is_bf16, 1, in,
                                (const uint8_t *)(intptr_t)layer[which], out, scale_format, y,
                                is_bf16, level, num_threads)
        : bits == 4 ? INT4_MATVEC(x, in, (const uint8_t *)(intptr_t)layer[which], out, y,
                                num_threads)
                  : INT8_MATVEC(x, in, (const int8_t *)(intptr_t)layer[which],
                                (const T *)(intptr_t)layer[which + 1], out, y, num_threads);
    NAME(add_bias)(y, (const T *)(intptr_t)layer[which + 2], out);
    return status;
}

/* `hidden` [hidden_size]: the token's embedding in, the residual stream after the
 * last layer out (before the final norm). `layers` [num_layers, POINTERS_PER_LAYER],
 * each projection with its bits (int8_dot's tiles with their scale format, run at
 * ISA `level`, or int4 ones with scales of type T).
 * `cos`, `sin` [head_dim] (sin's first half negated); `slot` where this token's k/v
 * go; `table` [max_blocks] and `seq_len` its context after this token. The caches
 * hold T, or, with `cache_kind` CACHE_INT8 or CACHE_FP8, codes with the scales of
 * each layer's K_SCALES and V_SCALES: the rotated k and the v are then quantized
 * into them as `kv_cache_store` does for the Python loop. Returns 0, 1
 * for shapes the kernels do not take, 2 when memory ran out, 3 for a slot outside
 * the cache, 4 for a context longer than its table. */
int NAME(decode_one)(T *hidden, const int64_t *layers, int64_t num_layers,
                    int64_t hidden_size, int64_t num_heads, int64_t num_kv_heads,
                    int64_t head_dim, int64_t intermediate, const T *cos,
                    const T *sin, const int64_t *slot, int64_t num_slots,
                    const int32_t *table, int64_t max_blocks, const int32_t *seq_len,
                    int64_t block_size, float scale, float eps, int num_threads, int level,
                    int cache_kind) {
    if (*seq_len < 1 || *seq_len > max_blocks * block_size) return 4;
    const int quantized = cache_kind == CACHE_INT8 || cache_kind == CACHE_FP8;
    const int64_t q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
    const int64_t qkv_size = q_size + 2 * kv_size;
    /* x, qkv, q, attention, projection, gate_up, activation, this token's k and v */
    const int64_t floats =
        hidden_size + qkv_size + 2 * q_size + hidden_size + 3 * intermediate + 2 * kv_size;
    T *buffer = malloc(sizeof(T) * (size_t)floats);
    if (buffer == NULL) return 2;
    T *x = buffer, *qkv = x + hidden_size, *q = qkv + qkv_size, *attn = q + q_size;
    T *proj = attn + q_size, *gate_up = proj + hidden_size, *act = gate_up + 2 * intermediate;
    T *kv_row = act + intermediate;
    const int64_t row_zero = 0;
    int status = 0;
    NAME(rms_norm)(hidden, (const T *)(intptr_t)layers[INPUT_NORM], x, 1, hidden_size, eps,
                  num_threads);
    for (int64_t i = 0; i < num_layers && status == 0; ++i) {
        const int64_t *layer = layers + i * POINTERS_PER_LAYER;
        T *k_cache = (T *)(intptr_t)layer[K_CACHE];
        T *v_cache = (T *)(intptr_t)layer[V_CACHE];
        if ((status = NAME(matvec)(x, hidden_size, layer, QKV, qkv_size, qkv, level, num_threads))) break;
        /* A quantized cache: k and v rotated into a one-slot scratch first. */
        const int rope =
            quantized ? NAME(rope_cache)(qkv, cos, sin, &row_zero, q, kv_row, kv_row + kv_size, 1,
                                         num_heads, num_kv_heads, head_dim, 1, num_threads)
                      : NAME(rope_cache)(qkv, cos, sin, slot, q, k_cache, v_cache, 1, num_heads,
                                         num_kv_heads, head_dim, num_slots, num_threads);
        if (rope) {
            status = rope == 2 ? 3 : 1;
            break;
        }
        if (quantized) {
            float *k_scales = (float *)(intptr_t)layer[K_SCALES];
            float *v_scales = (float *)(intptr_t)layer[V_SCALES];
            const int f32 = sizeof(T) == 4;
            int stored = kv_cache_store(kv_row, f32, slot, 1, num_kv_heads, head_dim, num_slots,
                                        cache_kind, k_cache, k_scales, num_threads);
            if (stored == 0)
                stored = kv_cache_store(kv_row + kv_size, f32, slot, 1, num_kv_heads, head_dim,
                                        num_slots, cache_kind, v_cache, v_scales, num_threads);
            if (stored) {
                status = stored == 2 ? 3 : 1;
                break;
            }
            if ((status = paged_decode_cache(q, f32, k_cache, v_cache, k_scales, v_scales,
                                             cache_kind, table, max_blocks, seq_len, attn, 1,
                                             num_heads, num_kv_heads, head_dim, block_size, scale,
                                             num_threads, 0, 0)))
                break;
        } else if ((status = NAME(paged_decode)(q, k_cache, v_cache, table, max_blocks, seq_len,
                                                attn, 1, num_heads, num_kv_heads, head_dim,
                                                block_size, scale, num_threads, 0, 0))) {
            break;
        }
        if ((status = NAME(matvec)(attn, q_size, layer, O, hidden_size, proj, level, num_threads))) break;
        NAME(add_rms_norm)(hidden, proj, (const T *)(intptr_t)layer[POST_NORM], x, 1,
                          hidden_size, eps, num_threads);
        if ((status = NAME(matvec)(x, hidden_size, layer, GATE_UP, 2 * intermediate, gate_up,
                             level, num_threads)))
            break;
        NAME(silu_mul)(gate_up, act, 1, intermediate, num_threads);
        if ((status = NAME(matvec)(act, intermediate, layer, DOWN, hidden_size, proj, level, num_threads)))
            break;
        if (i + 1 < num_layers) {
            NAME(add_rms_norm)(hidden, proj, (const T *)(intptr_t)layer[POINTERS_PER_LAYER + INPUT_NORM], x, 1,
                              hidden_size, eps, num_threads);
        } else {
            for (int64_t d = 0; d < hidden_size; ++d)
                hidden[d] = STORE(LOAD(hidden[d]) + LOAD(proj[d]));
        }
    }
    free(buffer);
    return status;
}

/* The parameters end here, so the next instantiation defines them afresh. */
#undef T
#undef LOAD
#undef STORE
#undef NAME
#undef INT4_MATVEC
#undef INT8_MATVEC
