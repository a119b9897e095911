"""Paged attention for one query token per sequence."""

from __future__ import annotations

import torch
import triton

from sluiceway.runner.kernels._paged_attention import check_cache, launch


def paged_attention_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of `query[b]` (`[B, H, D]`, the token at position `seq_lens[b] - 1`)
    over keys/values `0 .. seq_lens[b] - 1` of sequence b, read through
    `block_tables[b]` (int32 `[B, max_blocks]`) from caches
    `[num_blocks, block_size, KVH, D]`. The caller has already written this step's
    key and value. Returns `[B, H, D]` in the query dtype (into `out` when given);
    rows of sequences with `seq_lens[b] == 0` are left unwritten.
    """
    group = check_cache(query, key_cache, value_cache)
    if out is None:
        out = torch.empty_like(query)
    batch = query.shape[0]
    if batch == 0:
        return out
    block_m = max(16, triton.next_power_of_2(group))
    launch(
        query,
        key_cache,
        value_cache,
        out,
        block_tables,
        seq_lens,
        None,
        scale,
        grid=(batch, 1, key_cache.shape[2]),
        group=group,
        block_m=block_m,
    )
    return out
