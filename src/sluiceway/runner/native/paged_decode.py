"""`paged_decode`: decode attention read straight from the paged KV cache, in C.

`TorchAttention` otherwise gathers every decode sequence's blocks into a padded
batch and runs SDPA on it, for every layer of every step; this reads each
sequence's own slots in place and does work proportional to its real length.
bfloat16 caches (the default on a CPU with bfloat16), float32 caches (the
default elsewhere: at long contexts the gather + SDPA path takes markedly longer
per layer than this kernel, `benchmarks/attention_context.py`), and int8 or fp8
caches (`--kv-cache-dtype`), read and scaled row by row, never dequantized
whole; float16 keeps the torch path.
"""

from __future__ import annotations

import ctypes

import torch

from sluiceway.runner.native.library import bind

_ARGTYPES = (
    [ctypes.c_void_p, ctypes.c_int]  # q, q_f32
    + [ctypes.c_void_p] * 4  # k_cache, v_cache, k_scales, v_scales
    + [ctypes.c_int, ctypes.c_void_p]  # cache_kind, block_tables
    + [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]  # max_blocks, seq_lens, out
    + [ctypes.c_int64] * 5  # num_seqs, num_heads, num_kv_heads, head_dim, block_size
    + [ctypes.c_float, ctypes.c_int, ctypes.c_int]  # scale, num_threads, portable
    + [ctypes.c_int64]  # spans per context (0: the kernel chooses)
)

# The element types q takes, and the cache kinds (CACHE_* in paged_decode.c) by
# the name of a cache's format.
_QUERY_DTYPES = (torch.bfloat16, torch.float32)
_CACHE_KINDS = {"bfloat16": 0, "float32": 1, "int8": 2, "fp8": 3}
_STORAGE = {"bfloat16": torch.bfloat16, "float32": torch.float32, "int8": torch.int8, "fp8": torch.uint8}


def _function():
    return bind("paged_decode", "paged_decode_cache", _ARGTYPES, ctypes.c_int)


def native_decode_available(
    cache_format: str, query_dtype: torch.dtype, device: torch.device
) -> bool:
    """Whether `paged_decode` can serve a cache of format `cache_format`
    ("bfloat16", "float32", "int8" or "fp8" rows; `KVCacheFormat.name`) read by
    queries of `query_dtype` (bfloat16 or float32) on this device here (compiles
    the kernel on first call)."""
    return (
        cache_format in _CACHE_KINDS
        and query_dtype in _QUERY_DTYPES
        and device.type == "cpu"
        and _function() is not None
    )


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
    key_scales: torch.Tensor | None = None,
    value_scales: torch.Tensor | None = None,
    format: str | None = None,
) -> torch.Tensor:
    """Attention of one query per sequence over its cached context: `q [B, H, D]`
    (bfloat16 or float32), caches `[num_blocks, block_size, KVH, D]` on the CPU
    of `format` ("bfloat16" or "float32"; or "int8" or "fp8" codes with
    `key_scales`, `value_scales` float32 `[num_blocks, block_size, KVH]`; None:
    q's dtype),
    `block_tables` int32 `[B, max_blocks]`, `seq_lens` int32 `[B]` (each at least 1
    and covered by its table; with `max_seq_len`, the longest, that is checked against
    the tables' width, the block ids themselves are trusted). Returns `[B, H, D]` in
    q's dtype. `portable` skips the
    AVX512-BF16 path where it was compiled in (for tests); `spans` > 0 cuts every
    context into that many parts merged afterwards (for tests; 0 lets the kernel
    cut contexts only when there are too few sequences to keep every thread busy).
    Runs to completion once
    called: it holds no Python state and releases the GIL while it runs."""
    if q.dtype not in _QUERY_DTYPES or q.device.type != "cpu":
        raise ValueError("q must be a bfloat16 or float32 CPU tensor")
    format = format or str(q.dtype).removeprefix("torch.")
    if format not in _CACHE_KINDS:
        raise ValueError(f"no native decode over a {format} cache")
    for name, tensor in (("key_cache", key_cache), ("value_cache", value_cache)):
        if tensor.dtype != _STORAGE[format] or tensor.device.type != "cpu":
            raise ValueError(f"{name} must be a CPU tensor of a {format} cache")
    quantized = format in ("int8", "fp8")
    scales = (key_scales, value_scales)
    if quantized:
        for name, given in zip(("key_scales", "value_scales"), scales, strict=True):
            if (
                given is None
                or given.dtype != torch.float32
                or given.shape != key_cache.shape[:3]
                or not given.is_contiguous()
            ):
                raise ValueError(
                    f"a {format} cache needs {name}: contiguous float32 [blocks, block_size, KVH]"
                )
    elif key_scales is not None or value_scales is not None:
        raise ValueError(f"a {format} cache has no scales")
    fn = _function()
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
        int(q.dtype == torch.float32),
        key_cache.data_ptr(),
        value_cache.data_ptr(),
        key_scales.data_ptr() if key_scales is not None else None,
        value_scales.data_ptr() if value_scales is not None else None,
        _CACHE_KINDS[format],
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


_STORE_ARGTYPES = (
    [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]  # rows, rows_f32, slots
    + [ctypes.c_int64] * 4  # count, num_kv_heads, head_dim, num_slots
    + [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]  # kind, codes, scales, threads
)


def store_quantized_rows(
    rows: torch.Tensor, slots: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, format: str
) -> bool:
    """Quantize `rows` (`[T, KVH, D]`, bfloat16 or float32) to `format` ("int8" or
    "fp8") and store them at `slots` (`[T]` int64) of one layer's `codes`
    (`[num_blocks, block_size, KVH, D]`) and `scales` (`[num_blocks, block_size,
    KVH]`), bit for bit what `kv_cache.quantize_rows` gives. False, with nothing
    written, where the kernel does not take these tensors (the caller then stores
    with torch); IndexError for a slot outside the cache."""
    if (
        rows.dtype not in _QUERY_DTYPES
        or format not in ("int8", "fp8")
        or slots.dtype != torch.int64
        or codes.dtype != _STORAGE[format]
        or not all(t.device.type == "cpu" and t.is_contiguous() for t in (codes, scales))
        or rows.shape[1:] != codes.shape[2:]
        or slots.shape != rows.shape[:1]
    ):
        return False
    fn = bind("paged_decode", "kv_cache_store", _STORE_ARGTYPES, ctypes.c_int)
    if fn is None:
        return False
    rows, slots = rows.contiguous(), slots.contiguous()
    status = fn(
        rows.data_ptr(),
        int(rows.dtype == torch.float32),
        slots.data_ptr(),
        rows.shape[0],
        rows.shape[1],
        rows.shape[2],
        codes.shape[0] * codes.shape[1],
        _CACHE_KINDS[format],
        codes.data_ptr(),
        scales.data_ptr(),
        torch.get_num_threads(),
    )
    if status == 2:
        raise IndexError("a KV-cache slot is outside the cache")
    return status == 0
