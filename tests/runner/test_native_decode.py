"""The native (C) paged decode kernel: against a plain torch reference on scattered
block tables, inside `TorchAttention` against the SDPA path, and its fallbacks when
no compiler is there. The kernel is compiled once per session into the test cache."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch
import torch.nn.functional as F

from sluiceway.runner.attention import AttentionMetadata, TorchAttention
from sluiceway.runner.kv_cache import KVCache
from sluiceway.runner.native import library
from sluiceway.runner.native.paged_decode import native_decode_available, paged_decode

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


def _reference(q, key_cache, value_cache, tables, lens, scale, dtype=torch.bfloat16):
    """Each sequence's slots picked one by one, float32 attention, `dtype` result."""
    block_size = key_cache.shape[1]
    flat_k = key_cache.flatten(0, 1).float()
    flat_v = value_cache.flatten(0, 1).float()
    outs = []
    for b, length in enumerate(lens.tolist()):
        slots = [
            int(tables[b, t // block_size]) * block_size + t % block_size for t in range(length)
        ]
        keys, values = flat_k[slots].transpose(0, 1), flat_v[slots].transpose(0, 1)
        out = F.scaled_dot_product_attention(
            q[b].float()[:, None, :], keys, values, scale=scale, enable_gqa=True
        )
        outs.append(out[:, 0])
    return torch.stack(outs).to(dtype)


def _step_rows(tokens: int, heads: int, kv_heads: int, dim: int, seed: int):
    """A step's q `[tokens, heads, dim]`, k and v `[tokens, kv_heads, dim]`, bfloat16."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, heads, dim, generator=gen).to(torch.bfloat16)
    k = torch.randn(tokens, kv_heads, dim, generator=gen).to(torch.bfloat16)
    v = torch.randn(tokens, kv_heads, dim, generator=gen).to(torch.bfloat16)
    return q, k, v


def _case(heads, kv_heads, dim, lens, block_size=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    per_seq = max(-(-n // block_size) for n in lens) + 1  # one spare column, never read
    num_blocks = len(lens) * per_seq + 5
    shape = (num_blocks, block_size, kv_heads, dim)
    key_cache = torch.randn(shape, generator=gen).to(torch.bfloat16)
    value_cache = torch.randn(shape, generator=gen).to(torch.bfloat16)
    # Scattered, shuffled blocks: no sequence's context is contiguous in the cache.
    tables = torch.randperm(num_blocks, generator=gen)[: len(lens) * per_seq]
    tables = tables.view(len(lens), per_seq).to(torch.int32)
    q = torch.randn(len(lens), heads, dim, generator=gen).to(torch.bfloat16)
    return q, key_cache, value_cache, tables, torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim"),
    [(9, 3, 64), (8, 2, 128), (4, 4, 64), (4, 2, 16), (6, 1, 48)],
)
@pytest.mark.parametrize("lens", [[1], [16, 17, 15, 1], [200, 33, 64]])
def test_kernel_matches_reference(portable, heads, kv_heads, dim, lens):
    q, key_cache, value_cache, tables, seq_lens = _case(heads, kv_heads, dim, lens)
    scale = dim**-0.5
    got = paged_decode(q, key_cache, value_cache, tables, seq_lens, scale, portable=portable)
    want = _reference(q, key_cache, value_cache, tables, seq_lens, scale)
    assert got.dtype is torch.bfloat16 and got.shape == q.shape
    # Within bfloat16 rounding of the output (outputs are of order 1).
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("spans", [0, 1, 3])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (8, 2, 128), (6, 1, 48)])
@pytest.mark.parametrize("lens", [[1], [16, 17, 15, 1], [200, 33, 64]])
def test_float32_kernel_matches_reference(spans, heads, kv_heads, dim, lens):
    """A float32 cache (a float32 model's): float32 in and out, within float32
    rounding of the reference, whether contexts are cut into spans or not."""
    q, key_cache, value_cache, tables, seq_lens = (
        t.float() if t.dtype is torch.bfloat16 else t for t in _case(heads, kv_heads, dim, lens)
    )
    scale = dim**-0.5
    got = paged_decode(q, key_cache, value_cache, tables, seq_lens, scale, spans=spans)
    want = _reference(q, key_cache, value_cache, tables, seq_lens, scale, torch.float32)
    assert got.dtype is torch.float32 and got.shape == q.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize("spans", [2, 3, 7])
@pytest.mark.parametrize("lens", [[200], [1, 5, 130], [48, 17]])
def test_contexts_cut_into_spans_give_the_same_attention(portable, spans, lens):
    """Split-context decoding: spans that start mid-block, spans that are empty (a
    1-token context cut in 7) and a merge across them all."""
    q, key_cache, value_cache, tables, seq_lens = _case(9, 3, 64, lens, seed=3)
    scale = 0.125
    want = _reference(q, key_cache, value_cache, tables, seq_lens, scale)
    whole = paged_decode(
        q, key_cache, value_cache, tables, seq_lens, scale, portable=portable, spans=1
    )
    cut = paged_decode(
        q, key_cache, value_cache, tables, seq_lens, scale, portable=portable, spans=spans
    )
    torch.testing.assert_close(cut.float(), want.float(), atol=2e-2, rtol=2e-2)
    # The merge only reorders float32 sums: at most one bfloat16 rounding apart.
    torch.testing.assert_close(cut.float(), whole.float(), atol=1e-2, rtol=2**-7)


def test_kernel_reads_only_each_sequences_own_context():
    q, key_cache, value_cache, tables, seq_lens = _case(9, 3, 64, [40, 3])
    before = paged_decode(q, key_cache, value_cache, tables, seq_lens, 0.125)
    # Scribble over everything outside the two contexts: slots past each length in
    # their last block, the spare table columns and the blocks nobody owns.
    used = torch.zeros(key_cache.shape[:2], dtype=torch.bool)
    for b, length in enumerate(seq_lens.tolist()):
        for t in range(length):
            used[tables[b, t // 16], t % 16] = True
    key_cache[~used] = 1e4
    value_cache[~used] = float("nan")
    after = paged_decode(q, key_cache, value_cache, tables, seq_lens, 0.125)
    assert torch.equal(before, after)


def test_kernel_refuses_what_it_cannot_do():
    q, key_cache, value_cache, tables, seq_lens = _case(9, 3, 64, [20])
    with pytest.raises(ValueError, match="overruns"):
        paged_decode(q, key_cache, value_cache, tables, seq_lens, 0.125, max_seq_len=10_000)
    with pytest.raises(ValueError, match="float32 cache"):  # the cache is q's dtype unless named
        paged_decode(q.float(), key_cache, value_cache, tables, seq_lens, 0.125)
    with pytest.raises(ValueError, match="bfloat16 or float32"):
        paged_decode(q.half(), key_cache.half(), value_cache.half(), tables, seq_lens, 0.125)
    with pytest.raises(ValueError, match="does not take"):
        wide = torch.zeros(1, 51, 64, dtype=torch.bfloat16)  # 17 query heads per KV head
        paged_decode(wide, key_cache, value_cache, tables, seq_lens, 0.125)


def _decode_meta(tables, seq_lens, query_lens, block_size) -> AttentionMetadata:
    """Metadata for one step in which sequence b has `query_lens[b]` new tokens."""
    slots, starts = [], [0]
    for b, (length, new) in enumerate(zip(seq_lens, query_lens, strict=True)):
        for pos in range(length - new, length):
            slots.append(int(tables[b, pos // block_size]) * block_size + pos % block_size)
        starts.append(starts[-1] + new)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        block_tables=tables,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        scale=0.125,
        query_lens_host=tuple(query_lens),
        seq_lens_host=tuple(seq_lens),
    )


@pytest.mark.parametrize("query_lens", [[1, 1, 1], [1, 5, 1]])
def test_torch_attention_native_and_sdpa_decode_agree(query_lens):
    """All-decode steps and decode rows inside a mixed step (the `rows` path)."""
    seq_lens = [37, 20, 5]
    _, key_cache, value_cache, tables, _ = _case(9, 3, 64, seq_lens, seed=1)
    q, k, v = _step_rows(sum(query_lens), 9, 3, 64, seed=2)
    outs = {}
    for native in (True, False):
        cache = KVCache([key_cache.clone()], [value_cache.clone()], block_size=16)
        attention = TorchAttention(cache, native_decode=native)
        meta = attention.prepare(_decode_meta(tables, seq_lens, query_lens, 16))
        outs[native] = attention.forward(0, q, k, v, meta)
    torch.testing.assert_close(outs[True].float(), outs[False].float(), atol=2e-2, rtol=2e-2)


def test_auto_choice_follows_the_cache_dtype():
    assert native_decode_available("bfloat16", torch.bfloat16, torch.device("cpu"))
    bf16 = KVCache.allocate(
        num_layers=1, num_blocks=2, block_size=4, num_kv_heads=1, head_dim=8, dtype=torch.bfloat16
    )
    f32 = KVCache.allocate(
        num_layers=1, num_blocks=2, block_size=4, num_kv_heads=1, head_dim=8, dtype=torch.float32
    )
    f16 = KVCache.allocate(
        num_layers=1, num_blocks=2, block_size=4, num_kv_heads=1, head_dim=8, dtype=torch.float16
    )
    assert TorchAttention(bf16).native_decode
    assert TorchAttention(f32).native_decode
    assert not TorchAttention(bf16, native_decode=False).native_decode
    assert not TorchAttention(f16).native_decode
    with pytest.raises(ValueError, match="not available"):
        TorchAttention(f16, native_decode=True)


@pytest.fixture
def fresh_library(monkeypatch, tmp_path):
    """An empty kernel cache, and `load_library` forgetting what it loaded."""
    monkeypatch.setenv("SLUICEWAY_CACHE_DIR", str(tmp_path))
    library.load_library.cache_clear()
    yield tmp_path
    library.load_library.cache_clear()


def test_a_broken_compiler_falls_back_to_sdpa_with_a_warning(fresh_library, monkeypatch, caplog):
    monkeypatch.setenv("CC", "false")
    caplog.set_level(logging.WARNING)
    assert not native_decode_available("bfloat16", torch.bfloat16, torch.device("cpu"))
    assert "native kernel paged_decode unavailable" in caplog.text
    cache = KVCache.allocate(
        num_layers=1, num_blocks=2, block_size=4, num_kv_heads=1, head_dim=8, dtype=torch.bfloat16
    )
    assert not TorchAttention(cache).native_decode
    assert not list(fresh_library.rglob("*.so"))  # no half-written library left behind


def test_native_kernels_can_be_turned_off(fresh_library, monkeypatch):
    monkeypatch.setenv("SLUICEWAY_NATIVE", "0")
    assert not native_decode_available("bfloat16", torch.bfloat16, torch.device("cpu"))


def test_a_built_library_is_reused(fresh_library, monkeypatch):
    first = library.compile_library("paged_decode")
    assert first.parent == fresh_library / "native"

    def no_compiler(*args, **kwargs):
        raise AssertionError("compiled again")

    monkeypatch.setattr(library.subprocess, "run", no_compiler)
    assert library.compile_library("paged_decode") == first


def test_heads_beyond_the_kernel_fall_back_to_sdpa_for_good():
    """17 query heads on one KV head: more than the kernel takes. The backend
    switches to SDPA (and stays there) instead of failing the step."""
    seq_lens = [21, 6]
    _, key_cache, value_cache, tables, _ = _case(17, 1, 64, seq_lens, seed=4)
    q, k, v = _step_rows(2, 17, 1, 64, seed=5)
    outs = {}
    for native in (True, False):
        cache = KVCache([key_cache.clone()], [value_cache.clone()], block_size=16)
        attention = TorchAttention(cache, native_decode=native)
        meta = attention.prepare(_decode_meta(tables, seq_lens, [1, 1], 16))
        outs[native] = attention.forward(0, q, k, v, meta)
        assert attention.native_decode is False
    assert torch.equal(outs[True], outs[False])
