"""The triton paged-KV-cache kernels against naive torch references.

The reference gathers K/V through the block table, masks causally and softmaxes in
fp32. Physical blocks are shuffled and every slot no sequence owns is NaN, so a
kernel that reads a key it must not see fails loudly."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="triton is not importable; the paged KV-cache kernels need it")


POISON = float("nan")


@dataclasses.dataclass(frozen=True)
class PagedBatch:
    key_cache: torch.Tensor  # [num_blocks, block_size, KVH, D], unused slots NaN
    value_cache: torch.Tensor
    block_tables: torch.Tensor  # int32 [B, max_blocks], padded with block 0
    seq_lens: torch.Tensor  # int32 [B]
    query_start_loc: torch.Tensor  # int32 [B + 1]
    slot_mapping: torch.Tensor  # int64 [T]: this step's query positions
    query: torch.Tensor  # [T, H, D]
    key: torch.Tensor  # [T, KVH, D]: this step's keys (not yet in the cache)
    value: torch.Tensor
    max_query_len: int

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.query.shape[-1])


def make_batch(
    gen: torch.Generator,
    *,
    seq_lens: list[int],
    query_lens: list[int],
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: str,
) -> PagedBatch:
    """Random sequences whose cached prefixes (positions before this step's
    queries) are already written; this step's K/V are returned, not written.

    Physical blocks are handed out in a shuffled order, block 0 is never handed out
    (it pads the tables), and every slot no sequence owns holds NaN, so a kernel
    that reads a key it must not see produces NaN.
    """
    assert len(seq_lens) == len(query_lens)
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = 1 + sum(blocks_per_seq) + 3
    order = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    max_blocks = max(blocks_per_seq) + 2
    tables = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    taken = 0
    for i, n in enumerate(blocks_per_seq):
        tables[i, :n] = torch.tensor(order[taken : taken + n], dtype=torch.int32)
        taken += n

    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.full(shape, POISON, dtype=dtype)
    value_cache = torch.full(shape, POISON, dtype=dtype)
    flat_k, flat_v = (
        key_cache.view(-1, num_kv_heads, head_dim),
        value_cache.view(-1, num_kv_heads, head_dim),
    )

    def slot(i: int, pos: int) -> int:
        return int(tables[i, pos // block_size]) * block_size + pos % block_size

    step_slots = []
    for i, (n, q) in enumerate(zip(seq_lens, query_lens, strict=True)):
        assert 0 < q <= n
        for pos in range(n - q):
            flat_k[slot(i, pos)] = torch.randn(num_kv_heads, head_dim, generator=gen).to(dtype)
            flat_v[slot(i, pos)] = torch.randn(num_kv_heads, head_dim, generator=gen).to(dtype)
        step_slots += [slot(i, pos) for pos in range(n - q, n)]

    total = sum(query_lens)
    qsl = [0]
    for q in query_lens:
        qsl.append(qsl[-1] + q)

    def rand(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=gen).to(dtype).to(device)

    return PagedBatch(
        key_cache=key_cache.to(device),
        value_cache=value_cache.to(device),
        block_tables=tables.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        slot_mapping=torch.tensor(step_slots, dtype=torch.int64, device=device),
        query=rand(total, num_heads, head_dim),
        key=rand(total, num_kv_heads, head_dim),
        value=rand(total, num_kv_heads, head_dim),
        max_query_len=max(query_lens),
    )


def write_reference(batch: PagedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The caches after this step's K/V are written, by plain indexing."""
    k, v = batch.key_cache.clone(), batch.value_cache.clone()
    kvh, d = k.shape[2:]
    keep = batch.slot_mapping >= 0
    k.view(-1, kvh, d)[batch.slot_mapping[keep]] = batch.key[keep]
    v.view(-1, kvh, d)[batch.slot_mapping[keep]] = batch.value[keep]
    return k, v


def attention_reference(
    batch: PagedBatch, key_cache: torch.Tensor, value_cache: torch.Tensor
) -> torch.Tensor:
    """Causal attention of every query over its sequence, in fp32, from the caches."""
    num_heads = batch.query.shape[1]
    block_size, num_kv_heads = key_cache.shape[1:3]
    group = num_heads // num_kv_heads
    out = torch.zeros(batch.query.shape, dtype=torch.float32, device=batch.query.device)
    qsl = batch.query_start_loc.tolist()
    for i, n in enumerate(batch.seq_lens.tolist()):
        pos = torch.arange(n, device=key_cache.device)
        blocks = batch.block_tables[i].long()[pos // block_size]
        keys = key_cache[blocks, pos % block_size].float().repeat_interleave(group, dim=1)
        values = value_cache[blocks, pos % block_size].float().repeat_interleave(group, dim=1)
        q = batch.query[qsl[i] : qsl[i + 1]].float()
        q_pos = torch.arange(n - q.shape[0], n, device=q.device)
        scores = torch.einsum("qhd,khd->hqk", q, keys) * batch.scale
        visible = pos[None, :] <= q_pos[:, None]
        probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
        out[qsl[i] : qsl[i + 1]] = torch.einsum("hqk,khd->qhd", probs, values)
    return out


from sluiceway.runner.kernels import (  # noqa: E402
    paged_attention_decode,
    paged_attention_prefill,
    write_kv_cache,
)

DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.bfloat16, id="bf16"),
    pytest.param(torch.float16, id="fp16"),
]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert not actual.isnan().any()
    tol = {torch.float32: 2e-5, torch.float16: 2e-2}.get(dtype, 3e-2)
    torch.testing.assert_close(actual.float(), expected.float(), atol=tol, rtol=tol)


# (block_size, num_kv_heads, group, head_dim, seq_lens): lengths 1, a block
# boundary and the boundary +-1, GQA ratios 1, 3 and 4.
DECODE_CASES = [
    (16, 2, 1, 16, [1, 16, 15, 17, 32, 33]),
    (32, 1, 3, 32, [1, 32, 31, 33, 64, 90]),
    (16, 2, 4, 64, [5, 16, 48, 49, 81]),
    (32, 2, 3, 16, [2, 31, 32, 33, 63, 65]),
]

# (block_size, num_kv_heads, group, head_dim, seq_lens, query_lens): query_len <
# seq_len means a cached prefix (chunked prefill); a query_len of 1 is a decode
# riding along in a prefill batch.
PREFILL_CASES = [
    (16, 2, 1, 32, [1, 16, 17, 40], [1, 16, 17, 40]),
    (32, 1, 4, 16, [33, 70, 5], [33, 70, 5]),
    (16, 1, 3, 64, [40, 47, 95], [8, 1, 30]),
    (32, 2, 4, 32, [64, 31, 33], [32, 31, 1]),
    (16, 2, 1, 16, [96, 17], [90, 16]),
]


def _random_cases(count: int, seed: int) -> list[tuple]:
    """Shapes drawn from a seeded generator, so they are the same on every run."""
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        seq_lens = [rng.randint(1, 99) for _ in range(rng.randint(1, 4))]
        query_lens = [rng.choice([n, 1, rng.randint(1, n)]) for n in seq_lens]
        cases.append(
            (
                rng.choice([16, 32]),
                rng.choice([1, 2]),
                rng.choice([1, 3, 4]),
                rng.choice([16, 32, 64]),
                seq_lens,
                query_lens,
            )
        )
    return cases


PREFILL_CASES += _random_cases(4, seed=2024)


def _case_id(case: tuple) -> str:
    bs, kvh, group, d, seq_lens = case[:5]
    return f"bs{bs}-kvh{kvh}-g{group}-d{d}-L{'_'.join(map(str, seq_lens))}"


def _batch(seed: int, case: tuple, dtype: torch.dtype, device: str) -> PagedBatch:
    block_size, kvh, group, head_dim, seq_lens = case[:5]
    query_lens = case[5] if len(case) > 5 else [1] * len(seq_lens)
    return make_batch(
        torch.Generator().manual_seed(seed),
        seq_lens=seq_lens,
        query_lens=query_lens,
        block_size=block_size,
        num_heads=kvh * group,
        num_kv_heads=kvh,
        head_dim=head_dim,
        dtype=dtype,
        device=device,
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", DECODE_CASES, ids=_case_id)
def test_decode_matches_reference(case: tuple, dtype: torch.dtype, device: str) -> None:
    batch = _batch(1, case, dtype, device)
    key_cache, value_cache = write_reference(batch)
    out = paged_attention_decode(
        batch.query, key_cache, value_cache, batch.block_tables, batch.seq_lens, batch.scale
    )
    assert out.shape == batch.query.shape and out.dtype == dtype
    assert_close(out, attention_reference(batch, key_cache, value_cache), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", PREFILL_CASES, ids=_case_id)
def test_prefill_matches_reference(case: tuple, dtype: torch.dtype, device: str) -> None:
    batch = _batch(2, case, dtype, device)
    key_cache, value_cache = write_reference(batch)
    out = paged_attention_prefill(
        batch.query,
        key_cache,
        value_cache,
        batch.block_tables,
        batch.seq_lens,
        batch.query_start_loc,
        batch.scale,
        batch.max_query_len,
    )
    assert out.shape == batch.query.shape and out.dtype == dtype
    assert_close(out, attention_reference(batch, key_cache, value_cache), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", PREFILL_CASES[2:4], ids=_case_id)
def test_write_then_prefill(case: tuple, dtype: torch.dtype, device: str) -> None:
    """The real step order: this step's K/V go in through the kernel, then attention."""
    batch = _batch(3, case, dtype, device)
    key_cache, value_cache = batch.key_cache.clone(), batch.value_cache.clone()
    write_kv_cache(batch.key, batch.value, key_cache, value_cache, batch.slot_mapping)
    expected_k, expected_v = write_reference(batch)
    assert torch.equal(key_cache.nan_to_num(), expected_k.nan_to_num())
    assert torch.equal(value_cache.nan_to_num(), expected_v.nan_to_num())
    out = paged_attention_prefill(
        batch.query,
        key_cache,
        value_cache,
        batch.block_tables,
        batch.seq_lens,
        batch.query_start_loc,
        batch.scale,
        batch.max_query_len,
    )
    assert_close(out, attention_reference(batch, expected_k, expected_v), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("block_size", "num_kv_heads", "head_dim"), [(16, 1, 16), (32, 3, 64), (16, 8, 32)]
)
def test_write_kv_cache_strided_and_skipped(
    block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: str
) -> None:
    """Keys and values sliced out of one fused projection; negative slots are skipped."""
    gen = torch.Generator().manual_seed(4)
    num_blocks, tokens = 6, 20
    fused = torch.randn(tokens, 3, num_kv_heads, head_dim, generator=gen).to(dtype).to(device)
    key, value = fused[:, 1], fused[:, 2]
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    slots[::5] = -1
    slots = slots.to(device)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.zeros(shape, dtype=dtype, device=device)
    value_cache = torch.zeros(shape, dtype=dtype, device=device)
    write_kv_cache(key, value, key_cache, value_cache, slots)
    expected_k, expected_v = torch.zeros_like(key_cache), torch.zeros_like(value_cache)
    keep = slots >= 0
    expected_k.view(-1, num_kv_heads, head_dim)[slots[keep]] = key[keep]
    expected_v.view(-1, num_kv_heads, head_dim)[slots[keep]] = value[keep]
    assert torch.equal(key_cache, expected_k)
    assert torch.equal(value_cache, expected_v)


def test_decode_equals_single_token_prefill(device: str) -> None:
    batch = _batch(5, DECODE_CASES[1], torch.float32, device)
    key_cache, value_cache = write_reference(batch)
    args = (key_cache, value_cache, batch.block_tables, batch.seq_lens)
    decode = paged_attention_decode(batch.query, *args, batch.scale)
    prefill = paged_attention_prefill(batch.query, *args, batch.query_start_loc, batch.scale, 1)
    torch.testing.assert_close(decode, prefill, atol=1e-5, rtol=1e-5)


def test_rejects_mismatched_shapes(device: str) -> None:
    cache = torch.zeros(4, 16, 2, 32, device=device)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        paged_attention_decode(
            torch.zeros(1, 3, 32, device=device),
            cache,
            cache,
            torch.zeros(1, 1, dtype=torch.int32, device=device),
            torch.ones(1, dtype=torch.int32, device=device),
            1.0,
        )


def test_prefill_strided_query_and_block_table(device: str) -> None:
    """A query sliced out of a fused qkv projection and a block table that is a
    column-strided view: the kernel must honour every stride it is given."""
    batch = _batch(6, PREFILL_CASES[2], torch.float32, device)
    key_cache, value_cache = write_reference(batch)
    tokens, heads, dim = batch.query.shape
    fused = torch.randn(tokens, heads + 2, dim, device=device)
    fused[:, 1 : heads + 1] = batch.query
    query = fused[:, 1 : heads + 1]
    rows, cols = batch.block_tables.shape
    wide = torch.full((rows, 2 * cols + 3), -7, dtype=torch.int32, device=device)
    wide[:, : 2 * cols : 2] = batch.block_tables
    tables = wide[:, : 2 * cols : 2]
    assert not query.is_contiguous() and tables.stride() == (2 * cols + 3, 2)
    out = paged_attention_prefill(
        query,
        key_cache,
        value_cache,
        tables,
        batch.seq_lens,
        batch.query_start_loc,
        batch.scale,
        batch.max_query_len,
    )
    assert_close(out, attention_reference(batch, key_cache, value_cache), torch.float32)
