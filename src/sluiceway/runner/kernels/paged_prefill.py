"""Causal paged attention for prefill and chunked prefill over a flattened batch."""

from __future__ import annotations

import torch
import triton

from sluiceway.runner.kernels._paged_attention import check_cache, launch

# Rows (query token x query head of one kv head) per program.
_PREFILL_BLOCK_M = 64


def paged_attention_prefill(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    max_query_len: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention for `query` (`[T, H, D]`, sequences concatenated).

    Sequence i owns query rows `query_start_loc[i] .. query_start_loc[i+1] - 1`;
    they are the last `q_len_i` positions of its `seq_lens[i]`-long context, so
    query j sits at position `seq_lens[i] - q_len_i + j` and attends to positions
    `0 ..` that position (a cached prefix included), read through `block_tables[i]`
    from the paged caches after this step's keys and values were written.
    `max_query_len` (a host int, >= every q_len_i) sizes the launch grid so no
    device-to-host sync is needed. Returns `[T, H, D]` (into `out` when given);
    query rows not covered by `query_start_loc` are left unwritten.
    """
    group = check_cache(query, key_cache, value_cache)
    if out is None:
        out = torch.empty_like(query)
    batch = seq_lens.shape[0]
    if batch == 0 or query.shape[0] == 0 or max_query_len <= 0:
        return out
    block_m = max(_PREFILL_BLOCK_M, triton.next_power_of_2(group))
    block_q = block_m // group
    launch(
        query,
        key_cache,
        value_cache,
        out,
        block_tables,
        seq_lens,
        query_start_loc,
        scale,
        grid=(batch, triton.cdiv(max_query_len, block_q), key_cache.shape[2]),
        group=group,
        block_m=block_m,
    )
    return out
