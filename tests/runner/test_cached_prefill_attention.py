"""Prefill chunks that continue a cached context (prefix-cache hits, later chunks of a
long prompt) attend in padded groups: the same outputs as attending each chunk over
its own context, with one SDPA per group of similar chunks."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from sluiceway.runner import attention  # noqa: E402
from sluiceway.runner.kv_cache import KVCache  # noqa: E402

BLOCK_SIZE = 16
NUM_KV_HEADS, GROUP, HEAD_DIM = 2, 3, 32


def _meta(tables: list[list[int]], q_lens: list[int], seq_lens: list[int]):
    slots = []
    for table, q, n in zip(tables, q_lens, seq_lens, strict=True):
        slots += [table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(n - q, n)]
    width = max(len(t) for t in tables)
    starts = [0]
    for q in q_lens:
        starts.append(starts[-1] + q)
    return attention.AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        scale=HEAD_DIM**-0.5,
        query_lens_host=tuple(q_lens),
        seq_lens_host=tuple(seq_lens),
    )


def _tables(seq_lens: list[int]) -> list[list[int]]:
    """Disjoint block tables, handed out in a shuffled order."""
    need = [-(-n // BLOCK_SIZE) for n in seq_lens]
    order = torch.randperm(sum(need), generator=torch.Generator().manual_seed(3)).tolist()
    tables, used = [], 0
    for n in need:
        tables.append([b + 1 for b in order[used : used + n]])  # block 0 stays unused
        used += n
    return tables


def _cache(tables: list[list[int]]) -> KVCache:
    """A one-layer float32 cache with room for `tables` (block 0 unused)."""
    return KVCache.allocate(
        num_layers=1,
        num_blocks=1 + sum(len(t) for t in tables),
        block_size=BLOCK_SIZE,
        num_kv_heads=NUM_KV_HEADS,
        head_dim=HEAD_DIM,
        dtype=torch.float32,
        device="cpu",
    )


def _reference(cache: KVCache, q, meta, tables) -> torch.Tensor:
    """Each sequence's queries over its whole context read slot by slot, in float64."""
    keys, values = (
        c[0].reshape(-1, NUM_KV_HEADS, HEAD_DIM) for c in (cache.key_caches, cache.value_caches)
    )
    out = torch.empty_like(q, dtype=torch.float64)
    start = 0
    for table, q_len, seq_len in zip(tables, meta.query_lens_host, meta.seq_lens_host, strict=True):
        slots = torch.tensor(
            [table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(seq_len)]
        )
        k = keys[slots].double().repeat_interleave(GROUP, dim=1)  # [L, H, D]
        v = values[slots].double().repeat_interleave(GROUP, dim=1)
        for i in range(q_len):
            position = seq_len - q_len + i
            scores = (
                torch.einsum("hd,lhd->hl", q[start + i].double(), k[: position + 1]) * meta.scale
            )
            out[start + i] = torch.einsum("hl,lhd->hd", scores.softmax(-1), v[: position + 1])
        start += q_len
    return out


def test_cached_chunks_next_to_fresh_prompts_and_decodes_match_the_reference() -> None:
    gen = torch.Generator().manual_seed(11)
    q_lens = [17, 5, 1, 12, 3, 64, 9]
    seq_lens = [17, 37, 20, 30, 300, 80, 25]  # fresh, cached, decode, cached, long context, ...
    tables = _tables(seq_lens)
    cache = _cache(tables)
    for c in (*cache.key_caches, *cache.value_caches):  # the earlier steps' keys and values
        c.copy_(torch.randn(c.shape, generator=gen))
    meta = _meta(tables, q_lens, seq_lens)
    tokens = sum(q_lens)
    q = torch.randn(tokens, NUM_KV_HEADS * GROUP, HEAD_DIM, generator=gen)
    k = torch.randn(tokens, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    v = torch.randn(tokens, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    backend = attention.TorchAttention(cache, native_decode=False)
    prepared = backend.prepare(meta)
    # The cached chunks: the long-context one and the 64-token one each go alone,
    # the short ones together.
    assert sorted(int(g.valid.sum()) for g in prepared.plan.cached) == [3, 5 + 12 + 9, 64]
    out = backend.forward(0, q, k, v, prepared)
    torch.testing.assert_close(
        out.double(), _reference(cache, q, meta, tables), rtol=1e-5, atol=1e-5
    )


def test_thirty_similar_cached_chunks_take_one_sdpa_per_layer(monkeypatch) -> None:
    """What the change was for: a step that admits 30 chat prompts whose template is
    already cached had run 30 SDPA calls in every layer."""
    q_lens = [10 + b % 4 for b in range(30)]
    seq_lens = [q + 24 for q in q_lens]
    tables = _tables(seq_lens)
    cache = _cache(tables)
    meta = _meta(tables, q_lens, seq_lens)
    backend = attention.TorchAttention(cache, native_decode=False)
    prepared = backend.prepare(meta)
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", counting)
    tokens = sum(q_lens)
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(tokens, NUM_KV_HEADS * GROUP, HEAD_DIM, generator=gen)
    k = torch.randn(tokens, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    out = backend.forward(0, q, k, k, prepared)
    assert calls == [(30, NUM_KV_HEADS * GROUP, 13, HEAD_DIM)]
    assert torch.isfinite(out).all()


@pytest.mark.parametrize(
    ("chunks", "groups"),
    [
        ([], []),
        ([(0, 0, 5, 40)], [[0]]),
        # similar chunks go together; a context 10x longer goes alone
        ([(0, 0, 5, 40), (1, 5, 6, 41), (2, 11, 5, 400)], [[0, 1], [2]]),
        # a long query run would pad the short ones past twice their work
        ([(0, 0, 4, 40), (1, 4, 4, 40), (2, 8, 4, 41), (3, 12, 64, 64)], [[0, 1, 2], [3]]),
    ],
)
def test_similar_chunks_bound_the_padded_work(chunks, groups) -> None:
    got = attention._similar_chunks(chunks)
    assert [[c[0] for c in group] for group in got] == groups
    for group in got:
        padded = len(group) * max(c[2] for c in group) * max(c[3] for c in group)
        assert padded <= attention._MAX_PADDED_WORK * sum(c[2] * c[3] for c in group)
