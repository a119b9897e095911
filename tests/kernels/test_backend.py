"""`TritonAttention` is a drop-in for the runner's `TorchAttention`: same cache
writes, same outputs, for decode-only and mixed prefill/decode steps."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="triton is not importable; the paged KV-cache kernels need it")
attention = pytest.importorskip("sluiceway.runner.attention")
kv_cache_mod = pytest.importorskip("sluiceway.runner.kv_cache")

from sluiceway.runner.kernels.backend import (  # noqa: E402
    TritonAttention,
    select_attention_backend,
)

BLOCK_SIZE = 16
NUM_KV_HEADS, GROUP, HEAD_DIM = 2, 3, 32


def _meta(gen, block_tables, q_lens, seq_lens, device):
    slots = []
    for b, (q, n) in enumerate(zip(q_lens, seq_lens, strict=True)):
        slots += [
            block_tables[b][p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(n - q, n)
        ]
    width = max(len(t) for t in block_tables)
    tables = [t + [0] * (width - len(t)) for t in block_tables]
    qsl = [0]
    for q in q_lens:
        qsl.append(qsl[-1] + q)
    return attention.AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        scale=HEAD_DIM**-0.5,
        query_lens_host=tuple(q_lens),
        seq_lens_host=tuple(seq_lens),
    )


def _step(gen, backends, meta, device):
    tokens = meta.slot_mapping.shape[0]
    q = torch.randn(tokens, NUM_KV_HEADS * GROUP, HEAD_DIM, generator=gen).to(device)
    k = torch.randn(tokens, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(device)
    v = torch.randn(tokens, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(device)
    outs = []
    for backend in backends:
        prepared = backend.prepare(meta)
        outs.append([backend.forward(layer, q, k, v, prepared) for layer in range(2)])
    return outs


def test_triton_backend_matches_torch_backend(device: str) -> None:
    """A prompt prefill, a chunked prefill next to decodes, then a decode-only step."""
    gen = torch.Generator().manual_seed(7)

    def cache():
        return kv_cache_mod.KVCache.allocate(
            num_layers=2,
            num_blocks=12,
            block_size=BLOCK_SIZE,
            num_kv_heads=NUM_KV_HEADS,
            head_dim=HEAD_DIM,
            dtype=torch.float32,
            device=device,
        )

    torch_backend = attention.TorchAttention(cache())
    triton_backend = TritonAttention(cache())
    tables = [[5, 2], [9, 1, 11], [3, 7]]
    steps = [
        ([17, 20, 16], [17, 20, 16]),  # prompts; the third ends on a block boundary
        ([1, 13, 1], [18, 33, 17]),  # decode, chunk of a prompt, decode
        ([1, 1, 1], [19, 34, 18]),
    ]
    for q_lens, seq_lens in steps:
        meta = _meta(gen, tables, q_lens, seq_lens, device)
        expected, actual = _step(gen, [torch_backend, triton_backend], meta, device)
        for layer in range(2):
            torch.testing.assert_close(actual[layer], expected[layer], atol=2e-5, rtol=2e-5)
    for layer in range(2):
        assert torch.equal(
            triton_backend.kv_cache.key_caches[layer], torch_backend.kv_cache.key_caches[layer]
        )
        assert torch.equal(
            triton_backend.kv_cache.value_caches[layer], torch_backend.kv_cache.value_caches[layer]
        )


def test_select_attention_backend() -> None:
    assert select_attention_backend("torch", "cuda") is attention.TorchAttention
    assert select_attention_backend("auto", "cpu") is attention.TorchAttention
    assert select_attention_backend("auto", "cuda") is TritonAttention
    with pytest.raises(ValueError, match="unknown attention backend"):
        select_attention_backend("flash", "cpu")
