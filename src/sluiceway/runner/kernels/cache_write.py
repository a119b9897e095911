"""Scatter this step's keys and values into the paged KV cache."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sluiceway.runner.kernels._jit import lazy_jit


@lazy_jit
def _write_kv_cache_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_kcd,
    stride_vcb,
    stride_vcs,
    stride_vch,
    stride_vcd,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    # One program per token: all of its kv heads in one [HEADS_PAD, DIM_PAD] tile.
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    h = tl.arange(0, HEADS_PAD)[:, None]
    d = tl.arange(0, DIM_PAD)[None, :]
    mask = (h < NUM_KV_HEADS) & (d < HEAD_DIM)
    k = tl.load(key_ptr + tok * stride_kt + h * stride_kh + d * stride_kd, mask=mask)
    v = tl.load(value_ptr + tok * stride_vt + h * stride_vh + d * stride_vd, mask=mask)
    kc = key_cache_ptr + block * stride_kcb + offset * stride_kcs + h * stride_kch + d * stride_kcd
    vc = (
        value_cache_ptr + block * stride_vcb + offset * stride_vcs + h * stride_vch + d * stride_vcd
    )
    tl.store(kc, k.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(vc, v.to(value_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store `key[t]` / `value[t]` (`[T, KVH, D]`) at cache slot `slot_mapping[t]`.

    The caches are `[num_blocks, block_size, KVH, D]`; slot `s` is row `s % block_size`
    of block `s // block_size`. A negative slot skips that token. Values are cast to
    the cache dtype. `key` and `value` may be strided views (e.g. of a fused qkv).
    """
    num_tokens, num_kv_heads, head_dim = key.shape
    if value.shape != key.shape:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} differ")
    if key_cache.shape != value_cache.shape or key_cache.shape[2:] != (num_kv_heads, head_dim):
        raise ValueError(f"cache {tuple(key_cache.shape)} does not fit key {tuple(key.shape)}")
    if slot_mapping.shape != (num_tokens,):
        raise ValueError(f"slot_mapping {tuple(slot_mapping.shape)} is not [{num_tokens}]")
    if num_tokens == 0:
        return
    _write_kv_cache_kernel[(num_tokens,)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        *key.stride(),
        *value.stride(),
        *key_cache.stride(),
        *value_cache.stride(),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        DIM_PAD=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=key_cache.shape[1],
    )
