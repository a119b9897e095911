"""`paged_decode`: decode attention read straight from the paged KV cache, in C.

`TorchAttention` otherwise gathers every decode sequence's blocks into a padded
batch and runs SDPA on it, for every layer of every step; this reads each
sequence's own slots in place and does work proportional to its real length.
bfloat16 caches (the default on a CPU with bfloat16) and float32 caches (the
default elsewhere: at long contexts the gather + SDPA path takes markedly longer
per layer than this kernel, `benchmarks/attention_context.py`); float16 keeps the
torch path.
"""

from __future__ import annotations

import ctypes

import torch

from sluiceway.runner.native.library import bind

_ARGTYPES = (
    [ctypes.c_void_p] * 4  # q, k_cache, v_cache, block_tables
    + [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]  # max_blocks, seq_lens, out
    + [ctypes.c_int64] * 5  # num_seqs, num_heads, num_kv_heads, head_dim, block_size
    + [ctypes.c_float, ctypes.c_int, ctypes.c_int]  # scale, num_threads, portable
    + [ctypes.c_int64]  # spans per context (0: the kernel chooses)
)


_SYMBOLS = {torch.bfloat16: "paged_decode_bf16", torch.float32: "paged_decode_f32"}


def _function(dtype: torch.dtype = torch.bfloat16):
    return bind("paged_decode", _SYMBOLS[dtype], _ARGTYPES, ctypes.c_int)


def native_decode_available(cache_dtype: torch.dtype, device: torch.device) -> bool:
    """Whether `paged_decode` can serve a cache of this dtype (bfloat16 or float32)
    on this device here (compiles the kernel on first call)."""
    return cache_dtype in _SYMBOLS and device.type == "cpu" and _function(cache_dtype) is not None


def native_decode_takes(num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    """Whether the kernel takes these heads: at most 16 query heads per KV head and a
    head_dim of at most 256 (MAX_GROUP and MAX_HEAD_DIM in `paged_decode.c`)."""
    return (
        num_kv_heads >= 1
        and num_heads % num_kv_heads == 0
        and num_heads // num_kv_heads <= 16
        and head_dim <= 256
    )


def paged_decode(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    max_seq_len: int | None = None,
    portable: bool = False,
    spans: int = 0,
) -> torch.Tensor:
    """Attention of one query per sequence over its cached context: `q [B, H, D]`,
    caches `[num_blocks, block_size, KVH, D]` (all bfloat16, or all float32, on the CPU),
    `block_tables` int32 `[B, max_blocks]`, `seq_lens` int32 `[B]` (each at least 1
    and covered by its table; with `max_seq_len`, the longest, that is checked against
    the tables' width, the block ids themselves are trusted). Returns `[B, H, D]` in
    q's dtype. `portable` skips the
    AVX512-BF16 path where it was compiled in (for tests); `spans` > 0 cuts every
    context into that many parts merged afterwards (for tests; 0 lets the kernel
    cut contexts only when there are too few sequences to keep every thread busy).
    Runs to completion once
    called: it holds no Python state and releases the GIL while it runs."""
    if q.dtype not in _SYMBOLS:
        raise ValueError("q must be bfloat16 or float32")
    for name, tensor in (("q", q), ("key_cache", key_cache), ("value_cache", value_cache)):
        if tensor.dtype != q.dtype or tensor.device.type != "cpu":
            raise ValueError(f"{name} must be a {q.dtype} CPU tensor, as q")
    fn = _function(q.dtype)
    if fn is None:
        raise RuntimeError("the native paged_decode kernel is not available here")
    if block_tables.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise ValueError("block_tables and seq_lens must be int32")
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_dim = key_cache.shape
    if value_cache.shape != key_cache.shape or cache_dim != head_dim:
        raise ValueError("q and the caches disagree in shape")
    if block_tables.shape[0] != num_seqs or seq_lens.shape != (num_seqs,):
        raise ValueError("block_tables and seq_lens need one row per sequence")
    if max_seq_len is not None and max_seq_len > block_tables.shape[1] * block_size:
        raise ValueError(f"a context of {max_seq_len} tokens overruns its block table")
    q = q.contiguous()
    block_tables = block_tables.contiguous()
    seq_lens = seq_lens.contiguous()
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        raise ValueError("the caches must be contiguous")
    out = torch.empty_like(q)
    status = fn(
        q.data_ptr(),
        key_cache.data_ptr(),
        value_cache.data_ptr(),
        block_tables.data_ptr(),
        block_tables.shape[1],
        seq_lens.data_ptr(),
        out.data_ptr(),
        num_seqs,
        num_heads,
        num_kv_heads,
        head_dim,
        block_size,
        scale,
        torch.get_num_threads(),
        int(portable),
        spans,
    )
    if status == 1:
        raise ValueError(
            f"paged_decode does not take {num_heads} heads over {num_kv_heads} KV heads "
            f"of dimension {head_dim}"
        )
    if status != 0:
        raise MemoryError("paged_decode could not allocate its scratch memory")
    return out
