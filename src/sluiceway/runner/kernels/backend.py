"""`TritonAttention`: the runner's attention backend on the triton paged kernels,
and `select_attention_backend` for `--attention-backend auto|torch|triton`.

It implements `sluiceway.runner.attention.AttentionBackend` over the same
`KVCache` as `TorchAttention`, so the two are interchangeable per runner.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from sluiceway.runner.kv_cache import QUANTIZED_KV_CACHE_DTYPES

if TYPE_CHECKING:
    from sluiceway.runner.attention import AttentionBackend, AttentionMetadata
    from sluiceway.runner.kv_cache import KVCache

ATTENTION_BACKENDS = ("auto", "torch", "triton")


class TritonAttention:
    """Paged attention with triton kernels: per layer one cache-write launch, then
    one decode launch (every sequence has one query) or one prefill launch (any
    mix of prefill, chunked prefill and decode). No host syncs, no per-step plan.

    Honours the backend ordering rule: all of this step's keys and values are
    written before any are read, so sequences sharing prefix blocks in one step
    see each other's writes (kernels on one stream run in order).
    """

    def __init__(self, kv_cache: KVCache) -> None:
        if not kv_cache.stores_compute_dtype:
            raise ValueError(
                f"the triton attention backend reads a KV cache in the model's dtype, "
                f"not {kv_cache.format.name}; use --attention-backend torch"
            )
        # Imported here so that choosing the torch backend never needs triton.
        from sluiceway.runner.kernels.cache_write import write_kv_cache
        from sluiceway.runner.kernels.paged_decode import paged_attention_decode
        from sluiceway.runner.kernels.paged_prefill import paged_attention_prefill

        self.kv_cache = kv_cache
        self._write = write_kv_cache
        self._decode = paged_attention_decode
        self._prefill = paged_attention_prefill

    def prepare(self, meta: AttentionMetadata) -> AttentionMetadata:
        # Everything the kernels need is already in the metadata.
        return meta

    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
        *,
        kv_written: bool = False,
    ) -> torch.Tensor:
        """Write `k`, `v` (`[T, KVH, D]`) at `meta.slot_mapping` (unless `kv_written`:
        the caller did), then return causal paged attention for `q` (`[T, H, D]`) as
        `[T, H, D]` in `q`'s dtype."""
        key_cache = self.kv_cache.key_caches[layer]
        value_cache = self.kv_cache.value_caches[layer]
        if not kv_written:
            self._write(k, v, key_cache, value_cache, meta.slot_mapping)
        q = q.to(key_cache.dtype)
        max_query_len = meta.max_query_len
        if max_query_len == 1 and q.shape[0] == meta.num_seqs:
            # One query per sequence, so row b is sequence b's token.
            return self._decode(
                q, key_cache, value_cache, meta.block_tables, meta.seq_lens, meta.scale
            )
        return self._prefill(
            q,
            key_cache,
            value_cache,
            meta.block_tables,
            meta.seq_lens,
            meta.query_start_loc,
            meta.scale,
            max_query_len,
        )


def triton_available(device: torch.device | str) -> bool:
    """Whether the triton kernels can run on `device`: a CUDA device with triton
    installed, or any device under `TRITON_INTERPRET=1` (tests only: very slow)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    interpret = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
    return torch.device(device).type == "cuda" or interpret


def select_attention_backend(
    name: str, device: torch.device | str, *, kv_cache_dtype: str = "auto"
) -> Callable[[KVCache], AttentionBackend]:
    """The attention factory (`KVCache -> backend`) for `--attention-backend NAME`.

    `auto` picks triton on a CUDA device when triton imports, torch otherwise or
    for a quantized `kv_cache_dtype` (the triton kernels read float caches);
    `triton` raises ValueError where the kernels cannot run or the cache is
    quantized; `torch` always works.
    """
    quantized_cache = kv_cache_dtype in QUANTIZED_KV_CACHE_DTYPES
    from sluiceway.runner.attention import TorchAttention

    if name not in ATTENTION_BACKENDS:
        raise ValueError(
            f"unknown attention backend {name!r}; choose one of {', '.join(ATTENTION_BACKENDS)}"
        )
    dev = torch.device(device)
    if name == "torch":
        return TorchAttention
    if name == "auto":
        triton = dev.type == "cuda" and not quantized_cache and triton_available(dev)
        return TritonAttention if triton else TorchAttention
    if quantized_cache:
        raise ValueError(
            f"the triton attention backend reads float KV caches, not {kv_cache_dtype}; "
            "use --attention-backend torch"
        )
    if not triton_available(dev):
        raise ValueError(
            f"the triton attention backend needs a CUDA device with triton installed (device is {dev}); "
            "use --attention-backend torch"
        )
    return TritonAttention
