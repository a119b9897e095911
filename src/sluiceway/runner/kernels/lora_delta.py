"""The LoRA deltas of a mixed batch in two triton launches per linear.

Every row of a step's `[T, in]` activations names an adapter slot (or none:
the base model's row). The deltas `y[t] += B[s] @ (A[s] @ x[t])` of every row
are computed at once over the step's adapters stacked by slot: `A` `[S, R, in]`,
`B` `[S, out, R]` (ranks padded with zeros to the largest, scaling folded into
B), as punica's BGMV kernels do: a shrink launch (one program a row: its
`[R]` projection, in float32) and an expand launch (a program per row and block
of outputs, added into `y` and rounded once). Rows of the base model are
skipped by both. The work does not depend on how many adapters the step holds,
only on its rows; `runner/lora/rows.py` uses it on CUDA, and the tests run it in
triton's interpreter on CPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sluiceway.runner.kernels._jit import lazy_jit

_BLOCK_K = 64
_BLOCK_N = 64


@lazy_jit
def _shrink_kernel(
    x_ptr,
    a_ptr,
    slot_ptr,
    h_ptr,
    stride_xt,
    stride_as,
    stride_ar,
    stride_ht,
    IN: tl.constexpr,
    RANK: tl.constexpr,
    RANK_PAD: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    r = tl.arange(0, RANK_PAD)
    acc = tl.zeros([RANK_PAD], dtype=tl.float32)
    for start in range(0, IN, BLOCK_K):
        k = start + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + t * stride_xt + k, mask=k < IN, other=0.0).to(tl.float32)
        a = tl.load(
            a_ptr + slot * stride_as + r[:, None] * stride_ar + k[None, :],
            mask=(r[:, None] < RANK) & (k[None, :] < IN),
            other=0.0,
        ).to(tl.float32)
        acc += tl.sum(a * x[None, :], axis=1)
    tl.store(h_ptr + t * stride_ht + r, acc, mask=r < RANK)


@lazy_jit
def _expand_kernel(
    y_ptr,
    b_ptr,
    slot_ptr,
    h_ptr,
    stride_yt,
    stride_bs,
    stride_bn,
    stride_ht,
    OUT: tl.constexpr,
    RANK: tl.constexpr,
    RANK_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    r = tl.arange(0, RANK_PAD)
    h = tl.load(h_ptr + t * stride_ht + r, mask=r < RANK, other=0.0)
    b = tl.load(
        b_ptr + slot * stride_bs + n[:, None] * stride_bn + r[None, :],
        mask=(n[:, None] < OUT) & (r[None, :] < RANK),
        other=0.0,
    ).to(tl.float32)
    delta = tl.sum(b * h[None, :], axis=1)
    y = tl.load(y_ptr + t * stride_yt + n, mask=n < OUT, other=0.0).to(tl.float32)
    tl.store(y_ptr + t * stride_yt + n, (y + delta).to(y_ptr.dtype.element_ty), mask=n < OUT)


def lora_delta(
    y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor
) -> torch.Tensor:
    """`y` (`[T, out]`) with `b[s] @ (a[s] @ x[t])` added to each row `t` whose
    `slots[t]` (int32 `[T]`) is an adapter slot `s` >= 0; rows of slot -1 are
    left as they are. `x` `[T, in]`; `a` `[S, R, in]`, `b` `[S, out, R]`, the last
    dimension of each contiguous; the products accumulate in float32 and each
    output is rounded to `y`'s dtype once. Returns `y`, changed in place."""
    rows, in_features = x.shape
    slots_count, rank, a_in = a.shape
    out_features = y.shape[1]
    if a_in != in_features or b.shape != (slots_count, out_features, rank) or y.shape[0] != rows:
        raise ValueError(
            f"x {tuple(x.shape)}, y {tuple(y.shape)}, a {tuple(a.shape)} and b {tuple(b.shape)} "
            "do not fit together"
        )
    if slots.shape != (rows,):
        raise ValueError(f"slots {tuple(slots.shape)} is not [{rows}]")
    for name, tensor in (("x", x), ("y", y), ("a", a), ("b", b)):
        if tensor.stride(-1) != 1:
            raise ValueError(f"{name}'s last dimension is not contiguous")
    if rows == 0:
        return y
    h = torch.empty(rows, rank, dtype=torch.float32, device=x.device)
    rank_pad = max(triton.next_power_of_2(rank), 16)
    _shrink_kernel[(rows,)](
        x,
        a,
        slots,
        h,
        x.stride(0),
        a.stride(0),
        a.stride(1),
        h.stride(0),
        IN=in_features,
        RANK=rank,
        RANK_PAD=rank_pad,
        BLOCK_K=_BLOCK_K,
    )
    _expand_kernel[(rows, triton.cdiv(out_features, _BLOCK_N))](
        y,
        b,
        slots,
        h,
        y.stride(0),
        b.stride(0),
        b.stride(1),
        h.stride(0),
        OUT=out_features,
        RANK=rank,
        RANK_PAD=rank_pad,
        BLOCK_N=_BLOCK_N,
    )
    return y
