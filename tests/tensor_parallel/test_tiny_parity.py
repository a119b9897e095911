"""Greedy output split over ranks equals one device token for token, on tiny random
Llamas: tp=2 with 4 KV heads (split) and tp=4 with 2 (replicated), through chunked
prefill, prefix-cache hits and preemption. Ranks start once per model."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from tp_helpers import PROMPTS, alive, run_rounds, start_ranks, tiny_llama

from greedy_rounds import FewerBlocks, bare_core, embed_all
from sluiceway.runner.model_runner import TorchModelRunner
from sluiceway.runner.tensor_parallel import TensorParallelRunner

# vocab 254: four ranks hold 64 rows each, the last two of them padding.
CASES = {"tp2-kv4": (2, dict(kv_heads=4, vocab=254)), "tp4-kv2": (4, dict(kv_heads=2, vocab=254))}


@pytest.fixture(scope="module", params=list(CASES))
def case(request) -> Iterator[tuple[torch.nn.Module, TensorParallelRunner]]:
    size, shape = CASES[request.param]
    model = tiny_llama(**shape)
    runner = start_ranks(model, size)
    try:
        yield model, runner
    finally:
        runner.close()
    assert not any(alive(pid) for pid in runner.rank_pids)


def one_device(model) -> TorchModelRunner:
    return TorchModelRunner(model.config, model.state_dict(), block_size=4, num_blocks=64)


def test_batched_prompts_match_one_device(case):
    model, runner = case
    [want] = run_rounds(one_device(model), PROMPTS, budget=512)
    [got] = run_rounds(runner, PROMPTS, budget=512)
    assert got.tokens == want.tokens


def test_chunked_prefill_prefix_hits_and_preemption_match_one_device(case):
    model, runner = case
    # 5 tokens a step: the 13- and 21-token prompts are prefilled in chunks; 12
    # blocks of 4 tokens cannot hold every sequence at once; round two hits the cache.
    want = run_rounds(FewerBlocks(one_device(model), 12), PROMPTS, budget=5, rounds=2)
    got = run_rounds(FewerBlocks(runner, 12), PROMPTS, budget=5, rounds=2)
    assert want[0].preemptions > 0 and want[1].cached[2] > 0
    assert got == want


def embeddings(runner, pooling) -> list[torch.Tensor]:
    """Every prompt's embedding, 5 tokens a step (the long prompts in chunks)."""
    core = bare_core(runner, budget=5, max_model_len=64)
    return [torch.tensor(e) for e in embed_all(core, PROMPTS, pooling)]


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_embeddings_match_one_device(case, pooling):
    model, runner = case
    want = embeddings(one_device(model), pooling)
    for got, expected in zip(embeddings(runner, pooling), want, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
