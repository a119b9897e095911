"""Paged attention over the KV cache: per-step metadata, the backend interface, and
the torch reference backend (the CPU default).

Every backend honours one ordering rule: a layer's forward first writes ALL of
this step's keys and values into the cache, then reads. The engine's prefix cache
lets two sequences in one step share blocks, so sequence B may read slots that
sequence A writes in this very step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import attrs
import torch
import torch.nn.functional as F

from sluiceway.runner.kv_cache import KVCache
from sluiceway.runner.native.paged_decode import (
    native_decode_available,
    native_decode_takes,
    paged_decode,
)


@attrs.frozen
class AttentionMetadata:
    """What attention needs to know about one step's flattened batch of B sequences
    and T tokens. Sequence b's queries are the LAST `query_lens[b]` positions of its
    `seq_lens[b]`-long context and sit at rows `query_start_loc[b] .. query_start_loc[b+1]`.

    The tensors live on the model's device; the `*_host` tuples are the same numbers
    on the host so a backend can plan without device syncs. `plan` is filled by the
    backend's `prepare` with whatever it precomputes once per step.
    """

    slot_mapping: torch.Tensor  # int64 [T]
    block_tables: torch.Tensor  # int32 [B, max_blocks], padded with 0
    seq_lens: torch.Tensor  # int32 [B], context length after this step
    query_start_loc: torch.Tensor  # int32 [B + 1]
    scale: float
    query_lens_host: tuple[int, ...]
    seq_lens_host: tuple[int, ...]
    plan: Any = None

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_host)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens_host, default=0)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_host, default=0)


class AttentionBackend(Protocol):
    """Attention for every layer of one model over one `KVCache`.

    `prepare` runs once per step and returns the metadata every layer then gets
    (possibly with `plan` set); `forward` writes k/v at `slot_mapping` (unless
    `kv_written`: the caller already stored exactly these k/v there), then attends
    causally within each sequence, including its cached prefix, and returns
    `[T, num_heads, head_dim]`.
    """

    kv_cache: KVCache

    def prepare(self, meta: AttentionMetadata) -> AttentionMetadata: ...

    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
        *,
        kv_written: bool = False,
    ) -> torch.Tensor: ...


@attrs.frozen
class _DecodeGroup:
    """Sequences with one query each, attended in one call: the native kernel
    (`tables`, `lens`, `max_len`) or one batched SDPA (`blocks`, `mask`)."""

    rows: torch.Tensor | None  # token rows of the group's queries; None = all rows in order
    tables: torch.Tensor  # int32 [Bd, max_blocks] block tables
    lens: torch.Tensor  # int32 [Bd] context lengths
    max_len: int
    # For SDPA only (None with the native kernel):
    blocks: torch.Tensor | None  # int64 [Bd, nb] cache blocks of each context (Ld = nb * block_size)
    mask: torch.Tensor | None  # [Bd, 1, 1, Ld] in the cache dtype: 0 in the context, -inf past it


@attrs.frozen
class ContextGroup:
    """Chunks whose keys are read back from the cache (a later chunk of a long
    prompt, a prompt whose prefix the cache already held, or any chunk of a layer
    with a sliding window), attended in one padded call: each chunk's queries
    padded to the longest chunk, its context read from the cache as whole blocks,
    and a causal mask offset by where the chunk starts (narrowed to the window
    where there is one)."""

    rows: torch.Tensor  # int64 [G, q_max] token rows of each chunk; padding repeats its last
    valid: torch.Tensor  # bool [G, q_max]: which of `rows` are the chunk's own
    out_rows: torch.Tensor  # int64 [sum of q]: rows[valid]
    blocks: torch.Tensor  # int64 [G, nb] cache blocks of each context
    mask: torch.Tensor  # [G, 1, q_max, nb * block_size] in the cache dtype: 0 or -inf


@attrs.frozen
class _FreshPrefillGroup:
    """`count` sequences with no cached prefix whose chunks all have `length` tokens:
    their keys are exactly this step's k/v rows, so they attend in one batched
    causal SDPA without reading the cache back."""

    start: int  # the group's rows are start .. start + count * length when rows is None
    rows: torch.Tensor | None  # int64 [count * length] token rows, sequence by sequence
    count: int
    length: int


@attrs.frozen
class _TorchPlan:
    decode: _DecodeGroup | None
    cached: tuple[ContextGroup, ...]
    fresh: tuple[_FreshPrefillGroup, ...] = ()


class TorchAttention:
    """Paged attention in torch (SDPA) plus one C kernel; the CPU default.

    Decode sequences attend with the native `paged_decode` kernel where it is
    available (a bfloat16 or float32 cache on a CPU with a C compiler, faster than
    the SDPA path, see `native/paged_decode.py`); otherwise they are gathered
    into one padded batch with a length mask for SDPA. Prompts with nothing cached
    attend over their own keys, one SDPA per group of equal length; chunks that
    continue a cached context, one padded SDPA per group of similar size.

    `native_decode`: None picks the kernel where available, False never uses it,
    True requires it (ValueError when it is unavailable).
    """

    def __init__(self, kv_cache: KVCache, *, native_decode: bool | None = None) -> None:
        self.kv_cache = kv_cache
        cache_format = kv_cache.format
        available = native_decode_available(
            cache_format.name, cache_format.compute, kv_cache.key_caches[0].device
        )
        if native_decode and not available:
            raise ValueError("the native decode kernel is not available for this cache")
        self.native_decode = available if native_decode is None else native_decode
        self._native_heads = 0  # the query head count the kernel was found to take

    def prepare(self, meta: AttentionMetadata) -> AttentionMetadata:
        fresh, fresh_seqs = _plan_fresh_prefills(meta)
        plan = _TorchPlan(
            decode=self._plan_decode(meta),
            cached=self._plan_cached_prefills(meta, skip=fresh_seqs),
            fresh=fresh,
        )
        return attrs.evolve(meta, plan=plan)

    def _plan_decode(self, meta: AttentionMetadata) -> _DecodeGroup | None:
        decode_idx = [b for b, q in enumerate(meta.query_lens_host) if q == 1]
        if not decode_idx:
            return None
        all_rows = len(decode_idx) == meta.num_seqs
        idx = None if all_rows else torch.tensor(decode_idx, device=meta.seq_lens.device)
        tables = meta.block_tables if idx is None else meta.block_tables[idx]
        lens = meta.seq_lens if idx is None else meta.seq_lens[idx]
        max_len = max(meta.seq_lens_host[b] for b in decode_idx)
        if self.native_decode:
            return _DecodeGroup(
                rows=None if idx is None else meta.query_start_loc[idx].to(torch.int64),
                tables=tables.to(torch.int32).contiguous(),
                lens=lens.to(torch.int32).contiguous(),
                max_len=max_len,
                blocks=None,
                mask=None,
            )
        block_size = self.kv_cache.block_size
        nblocks = -(-max_len // block_size)
        blocks = tables[:, :nblocks].to(torch.int64)
        positions = torch.arange(nblocks * block_size, device=lens.device)
        # An additive float mask, built once per step: given a boolean one, SDPA
        # converts it with two `where`s in every layer.
        outside = (positions[None, :] >= lens[:, None])[:, None, None, :]
        dtype = self.kv_cache.format.compute
        mask = torch.zeros(outside.shape, dtype=dtype, device=lens.device).masked_fill(
            outside, float("-inf")
        )
        rows = None if idx is None else meta.query_start_loc[idx].to(torch.int64)
        return _DecodeGroup(
            rows=rows, tables=tables, lens=lens, max_len=max_len, blocks=blocks, mask=mask
        )

    def _plan_cached_prefills(
        self, meta: AttentionMetadata, skip: frozenset[int] = frozenset()
    ) -> tuple[ContextGroup, ...]:
        return context_groups(
            meta,
            self.kv_cache.block_size,
            self.kv_cache.format.compute,
            include=lambda b, q_len: q_len > 1 and b not in skip,
        )

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
        if not kv_written:
            self.kv_cache.write(layer, meta.slot_mapping, k, v)
        plan = meta.plan if meta.plan is not None else self.prepare(meta).plan
        if (
            plan.decode is not None
            and plan.decode.blocks is None
            and q.shape[1] != self._native_heads
        ):
            # The kernel's limits on heads can be checked only now, from q (once).
            kv_heads, head_dim = self.kv_cache.key_caches[layer].shape[2:]
            if native_decode_takes(q.shape[1], kv_heads, head_dim):
                self._native_heads = q.shape[1]
            else:  # SDPA for this step and every later one
                self.native_decode = False
                plan = self.prepare(meta).plan
        if plan.decode is not None and plan.decode.rows is None:
            return self._decode(q, layer, plan.decode, meta.scale)
        if len(plan.fresh) == 1 and plan.fresh[0].count * plan.fresh[0].length == q.shape[0]:
            return _fresh_prefill(q, k, v, plan.fresh[0], meta.scale)
        out = torch.empty_like(q)
        if plan.decode is not None:
            rows = plan.decode.rows
            out[rows] = self._decode(q[rows], layer, plan.decode, meta.scale)
        for group in plan.fresh:
            result = _fresh_prefill(q, k, v, group, meta.scale)
            if group.rows is None:
                out[group.start : group.start + result.shape[0]] = result
            else:
                out[group.rows] = result
        for cached in plan.cached:
            out[cached.out_rows] = self._cached_prefill(q, layer, cached, meta.scale)
        return out

    def _decode(
        self, q: torch.Tensor, layer: int, group: _DecodeGroup, scale: float
    ) -> torch.Tensor:
        cache = self.kv_cache
        if group.blocks is None or group.mask is None:
            return paged_decode(
                q.to(cache.format.compute),
                cache.key_caches[layer],
                cache.value_caches[layer],
                group.tables,
                group.lens,
                scale,
                max_seq_len=group.max_len,
                key_scales=None if cache.key_scales is None else cache.key_scales[layer],
                value_scales=None if cache.value_scales is None else cache.value_scales[layer],
                format=cache.format.name,
            ).to(q.dtype)
        keys, values = (t.transpose(1, 2) for t in cache.gather(layer, group.blocks))  # [Bd, KVH, Ld, D]
        # The query heads that share a KV head go in as that head's queries
        # ([Bd, KVH, H / KVH, D]) rather than as heads of one query each: the same
        # products, but CPU SDPA with one query per head is several times slower
        # (benchmarks/attention_decode.py).
        bd, heads, dim = q.shape
        grouped = q.view(bd, keys.shape[1], heads // keys.shape[1], dim)
        out = F.scaled_dot_product_attention(
            grouped, keys, values, attn_mask=group.mask, scale=scale
        )
        return out.reshape(bd, heads, dim)

    def _cached_prefill(
        self, q: torch.Tensor, layer: int, group: ContextGroup, scale: float
    ) -> torch.Tensor:
        """`[sum of q, H, D]`: the group's chunks' outputs, in `out_rows` order."""
        keys, values = (t.transpose(1, 2) for t in self.kv_cache.gather(layer, group.blocks))  # [G, KVH, L, D]
        out = F.scaled_dot_product_attention(
            q[group.rows].transpose(1, 2),  # [G, H, q_max, D]
            keys,
            values,
            attn_mask=group.mask,
            scale=scale,
            enable_gqa=True,
        )
        return out.transpose(1, 2)[group.valid]


# A group of cached-context chunks computes (and gathers) its longest query run
# against its longest context for every member; similar chunks go together while
# that padded work stays within this factor of the members' own.
_MAX_PADDED_WORK = 2.0

_Chunk = tuple[int, int, int, int]  # (sequence index, first row, query length, context length)


def _similar_chunks(chunks: list[_Chunk]) -> list[list[_Chunk]]:
    """`chunks` split into groups of similar query and context lengths: sorted by
    context length, a chunk joins the group before it unless that would pad the
    group's work past `_MAX_PADDED_WORK` times its own. One padded SDPA per group
    replaces one SDPA per chunk: a step that admits 30 chat prompts whose template
    is cached had made 900 small SDPA calls (30 chunks in 30 layers)."""
    groups: list[list[_Chunk]] = []
    for chunk in sorted(chunks, key=lambda c: (c[3], c[2])):
        group = groups[-1] if groups else None
        if group is not None:
            joined = [*group, chunk]
            padded = len(joined) * max(c[2] for c in joined) * max(c[3] for c in joined)
            if padded <= _MAX_PADDED_WORK * sum(c[2] * c[3] for c in joined):
                group.append(chunk)
                continue
        groups.append([chunk])
    return groups


def context_groups(
    meta: AttentionMetadata,
    block_size: int,
    dtype: torch.dtype,
    *,
    include: Callable[[int, int], bool] = lambda b, q_len: True,
    window: int | None = None,
) -> tuple[ContextGroup, ...]:
    """The chunks of `meta`'s sequences that `include(b, query_len)` accepts,
    grouped by similar size (`_similar_chunks`), each group with its additive
    mask in `dtype`. With a `window`, query position p sees key positions
    p - window < k <= p, as transformers' sliding-window mask does."""
    chunks = []
    start = 0
    for b, q_len in enumerate(meta.query_lens_host):
        if include(b, q_len):
            chunks.append((b, start, q_len, meta.seq_lens_host[b]))
        start += q_len
    return tuple(
        _context_group(meta.block_tables, members, block_size, dtype, window)
        for members in _similar_chunks(chunks)
    )


def _context_group(
    block_tables: torch.Tensor,
    members: list[_Chunk],
    block_size: int,
    dtype: torch.dtype,
    window: int | None,
) -> ContextGroup:
    device = block_tables.device
    q_max = max(q_len for _, _, q_len, _ in members)
    nblocks = -(-max(seq_len for *_, seq_len in members) // block_size)
    index = torch.tensor([b for b, *_ in members], device=device)
    first = torch.tensor([start for _, start, _, _ in members], device=device)
    q_lens = torch.tensor([q_len for _, _, q_len, _ in members], device=device)
    seq_lens = torch.tensor([seq_len for *_, seq_len in members], device=device)
    offsets = torch.arange(q_max, device=device)
    valid = offsets[None, :] < q_lens[:, None]
    # Query i of a chunk sits at position seq_len - q_len + i and sees keys 0 .. that
    # position; a padding query repeats the chunk's last, so every row sees a key.
    clamped = torch.minimum(offsets[None, :], q_lens[:, None] - 1)
    rows = first[:, None] + clamped
    positions = (seq_lens - q_lens)[:, None] + clamped
    keys = torch.arange(nblocks * block_size, device=device)
    hidden = keys[None, None, :] > positions[:, :, None]
    if window is not None:
        hidden |= keys[None, None, :] <= positions[:, :, None] - window
    mask = torch.zeros(hidden.shape, dtype=dtype, device=device).masked_fill(hidden, float("-inf"))
    return ContextGroup(
        rows=rows,
        valid=valid,
        out_rows=rows[valid],
        blocks=block_tables[index, :nblocks].to(torch.int64),
        mask=mask[:, None],
    )


def _plan_fresh_prefills(
    meta: AttentionMetadata,
) -> tuple[tuple[_FreshPrefillGroup, ...], frozenset[int]]:
    """Group the prefill chunks without a cached prefix by length (engines usually
    admit several prompts at once; one SDPA per group instead of one per prompt)."""
    by_length: dict[int, list[tuple[int, int]]] = {}
    start = 0
    for b, q_len in enumerate(meta.query_lens_host):
        if q_len > 1 and meta.seq_lens_host[b] == q_len:
            by_length.setdefault(q_len, []).append((b, start))
        start += q_len
    groups = []
    for length, members in by_length.items():
        first = members[0][1]
        contiguous = all(s == first + i * length for i, (_, s) in enumerate(members))
        rows = None
        if not contiguous:
            starts = torch.tensor([s for _, s in members], device=meta.seq_lens.device)
            offsets = torch.arange(length, device=starts.device)
            rows = (starts[:, None] + offsets).reshape(-1)
        groups.append(_FreshPrefillGroup(first, rows, len(members), length))
    seqs = frozenset(b for members in by_length.values() for b, _ in members)
    return tuple(groups), seqs


def _fresh_prefill(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: _FreshPrefillGroup, scale: float
) -> torch.Tensor:
    """Causal attention of a `_FreshPrefillGroup` over its own k/v: `[count * length, H, D]`."""
    if group.rows is None:
        span = slice(group.start, group.start + group.count * group.length)
        q, k, v = q[span], k[span], v[span]
    else:
        q, k, v = q[group.rows], k[group.rows], v[group.rows]
    shape = (group.count, group.length)
    out = F.scaled_dot_product_attention(
        q.unflatten(0, shape).transpose(1, 2),
        k.unflatten(0, shape).transpose(1, 2).to(q.dtype),
        v.unflatten(0, shape).transpose(1, 2).to(q.dtype),
        is_causal=True,
        scale=scale,
        enable_gqa=True,
    )
    return out.transpose(1, 2).reshape(-1, *q.shape[1:])
