"""The one triton kernel behind paged decode and paged prefill attention.

A program owns one kv head of one sequence and a tile of `BLOCK_M` rows, where a
row is a (query token, query head) pair: the `GROUP` query heads that share the kv
head are packed into the tile (row r is query `r // GROUP`, head `r % GROUP`), so
grouped-query attention reads each K/V block once per tile instead of once per
head, and a decode tile is not mostly padding. The program walks the sequence's
block table one physical block (`BLOCK_SIZE` keys) at a time with an online
softmax in fp32 and never reads past the last key its queries can see.

Row max and sum are spelled `tl.reduce(x, axis, tl.standard._elementwise_max /
_sum_combine)`, which is exactly what `tl.max` / `tl.sum` compile to for fp32,
because `tl.max`, `tl.sum`, `tl.cdiv` and `tl.zeros` are themselves jitted helpers: when
`triton.language` was imported before `TRITON_INTERPRET=1` was set (transformers
imports torch._inductor, which imports triton), the interpreter cannot call them,
but it recognises these combine functions and reduces with numpy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sluiceway.runner.kernels._jit import lazy_jit

_LOG2E = 1.4426950408889634


@lazy_jit
def _paged_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_ot,
    stride_oh,
    stride_od,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_vd,
    stride_bt_row,
    stride_bt_col,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    IS_DECODE: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    seq = tl.program_id(0)
    q_block = tl.program_id(1)
    kv_head = tl.program_id(2)
    BLOCK_Q: tl.constexpr = BLOCK_M // GROUP

    seq_len = tl.load(seq_lens_ptr + seq)
    if IS_DECODE:
        first_tok = seq
        q_len = 1
    else:
        first_tok = tl.load(query_start_loc_ptr + seq)
        q_len = tl.load(query_start_loc_ptr + seq + 1) - first_tok
    q_start = q_block * BLOCK_Q
    # Padded sequences (no queries, or an empty context) have nothing to compute.
    if (q_start >= q_len) | (seq_len <= 0):
        return
    # This step's queries are the last q_len positions of the context.
    ctx_before = seq_len - q_len

    rows = tl.arange(0, BLOCK_M)
    q_local = q_start + rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_valid = (rows // GROUP < BLOCK_Q) & (q_local < q_len)
    # Padding rows pretend to be position 0, so every row sees key 0 in the first
    # tile and the running max is finite from then on (no inf - inf = nan).
    q_pos = tl.where(row_valid, ctx_before + q_local, 0)
    tok = (first_tok + q_local).to(tl.int64)

    d = tl.arange(0, DIM_PAD)
    d_mask = d < HEAD_DIM
    q_mask = row_valid[:, None] & d_mask[None, :]
    q = tl.load(
        q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :] * stride_qd,
        mask=q_mask,
        other=0.0,
    )

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, DIM_PAD], 0.0, tl.float32)

    # Keys past the last query of this tile are never visible to it.
    kv_end = tl.minimum(seq_len, ctx_before + tl.minimum(q_start + BLOCK_Q, q_len))
    num_blocks = (kv_end + BLOCK_SIZE - 1) // BLOCK_SIZE
    offs_n = tl.arange(0, BLOCK_SIZE)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt_row
    k_base = k_cache_ptr + kv_head * stride_kh
    v_base = v_cache_ptr + kv_head * stride_vh
    for j in range(0, num_blocks):
        phys = tl.load(table + j * stride_bt_col).to(tl.int64)
        k_pos = j * BLOCK_SIZE + offs_n
        n_mask = k_pos < kv_end
        # K is read transposed, [DIM_PAD, BLOCK_SIZE], straight into the dot.
        k = tl.load(
            k_base + phys * stride_kb + offs_n[None, :] * stride_ks + d[:, None] * stride_kd,
            mask=n_mask[None, :] & d_mask[:, None],
            other=0.0,
        )
        if DOT_FP32:
            s = tl.dot(q.to(tl.float32), k.to(tl.float32), input_precision="ieee")
        else:
            s = tl.dot(q, k)
        s = s * qk_scale
        visible = (k_pos[None, :] <= q_pos[:, None]) & n_mask[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(s, 1, tl.standard._elementwise_max))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
        v = tl.load(
            v_base + phys * stride_vb + offs_n[:, None] * stride_vs + d[None, :] * stride_vd,
            mask=n_mask[:, None] & d_mask[None, :],
            other=0.0,
        )
        if DOT_FP32:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    acc = acc / l_i[:, None]
    tl.store(
        out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :] * stride_od,
        acc.to(out_ptr.dtype.element_ty),
        mask=q_mask,
    )


def check_cache(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor) -> int:
    """Validate shapes shared by decode and prefill; return the GQA group size."""
    if query.dim() != 3 or key_cache.dim() != 4:
        raise ValueError(
            f"query {tuple(query.shape)} must be [T, H, D] and the cache "
            f"{tuple(key_cache.shape)} [num_blocks, block_size, KVH, D]"
        )
    if key_cache.shape != value_cache.shape:
        raise ValueError(
            f"key cache {tuple(key_cache.shape)} != value cache {tuple(value_cache.shape)}"
        )
    num_heads, head_dim = query.shape[1:]
    num_kv_heads = key_cache.shape[2]
    if key_cache.shape[3] != head_dim or num_heads % num_kv_heads:
        raise ValueError(
            f"query {tuple(query.shape)} does not fit cache {tuple(key_cache.shape)}: "
            "head dims must match and num_heads must be a multiple of num_kv_heads"
        )
    if query.dtype != key_cache.dtype:
        raise ValueError(f"query dtype {query.dtype} != cache dtype {key_cache.dtype}")
    block_size = key_cache.shape[1]
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size {block_size} must be a power of two >= 16")
    return num_heads // num_kv_heads


def launch(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    out: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor | None,
    scale: float,
    grid: tuple[int, int, int],
    group: int,
    block_m: int,
) -> None:
    head_dim = query.shape[2]
    # The kernel indexes these as dense vectors; they are tiny, so copy if strided.
    seq_lens = seq_lens.contiguous()
    if query_start_loc is not None:
        query_start_loc = query_start_loc.contiguous()
    _paged_attention_kernel[grid](
        query,
        key_cache,
        value_cache,
        out,
        block_tables,
        seq_lens,
        # Decode never reads query_start_loc; any pointer-typed tensor will do.
        seq_lens if query_start_loc is None else query_start_loc,
        float(scale) * _LOG2E,
        *query.stride(),
        *out.stride(),
        *key_cache.stride(),
        *value_cache.stride(),
        *block_tables.stride(),
        GROUP=group,
        HEAD_DIM=head_dim,
        DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_SIZE=key_cache.shape[1],
        BLOCK_M=block_m,
        IS_DECODE=query_start_loc is None,
        # fp32 callers want fp32 results (tf32 would cost ~1e-3 relative error), and
        # triton 3.9's interpreter multiplies bfloat16 dot operands as raw uint16
        # bits, so under the interpreter every dot runs on fp32 copies.
        DOT_FP32=query.dtype == torch.float32 or _paged_attention_kernel.interpreted,
        num_warps=4,
    )
