"""Attention the paged backends do not implement: a sliding window narrower than
the context (Mistral, Gemma, Qwen2/3 with `use_sliding_window`) and soft-capped
attention logits (Gemma 2).

It reads the step's keys and values back from the KV cache, whose layout every
backend shares, in torch ops, so it runs on any device behind any backend. The
decoder sends only the layers and steps that need it here
(`Architecture.needs_masked_attention`); every other layer keeps its backend.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sluiceway.runner.attention import (
    AttentionMetadata,
    ContextGroup,
    context_groups,
)
from sluiceway.runner.kv_cache import KVCache


class MaskedAttentionPlan:
    """One step's chunks grouped for masked attention, one grouping per window
    (built when a layer with that window first asks, then shared by the rest)."""

    def __init__(self, meta: AttentionMetadata, kv_cache: KVCache) -> None:
        self._meta, self._kv_cache = meta, kv_cache
        self._groups: dict[int | None, tuple[ContextGroup, ...]] = {}

    def groups(self, window: int | None) -> tuple[ContextGroup, ...]:
        if window not in self._groups:
            self._groups[window] = context_groups(
                self._meta,
                self._kv_cache.block_size,
                self._kv_cache.format.compute,
                window=window,
            )
        return self._groups[window]


def masked_attention(
    layer: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    meta: AttentionMetadata,
    plan: MaskedAttentionPlan,
    kv_cache: KVCache,
    *,
    window: int | None,
    softcap: float | None,
    kv_written: bool = False,
) -> torch.Tensor:
    """Causal attention of `q [T, H, D]` over each sequence's context as the cache
    holds it after this step's `k`, `v` are stored (unless `kv_written`: the
    caller stored them), narrowed to `window` and with logits capped at
    `softcap`; `[T, H, D]` in `q`'s dtype."""
    if not kv_written:
        kv_cache.write(layer, meta.slot_mapping, k, v)
    out = torch.empty_like(q)
    for group in plan.groups(window):
        keys, values = (
            t.transpose(1, 2).to(q.dtype) for t in kv_cache.gather(layer, group.blocks)
        )  # [G, KVH, L, D]
        queries = q[group.rows].transpose(1, 2)  # [G, H, q_max, D]
        attended = _attend(queries, keys, values, group.mask.to(q.dtype), meta.scale, softcap)
        out[group.out_rows] = attended.transpose(1, 2)[group.valid]
    return out


def _attend(q, k, v, mask, scale: float, softcap: float | None) -> torch.Tensor:
    if softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    # transformers' eager attention, op for op: the product in the query dtype,
    # scaled after it, capped, masked, softmax in float32.
    repeats = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
    logits = torch.matmul(q, k.transpose(2, 3)) * scale
    logits = torch.tanh(logits / softcap) * softcap
    weights = F.softmax(logits + mask, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, v)
