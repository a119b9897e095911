"""Families beyond Llama split over two ranks equal one device token for token:
Phi-3 (fused qkv and gate/up checkpoint tensors, partial rotary), Qwen3-MoE (q/k
norms, experts split by their intermediate features, a dense layer beside them)
and Gemma 2 (sliding windows and soft caps over each rank's heads, norms after
the reduced sublayer outputs), through chunked prefill, prefix-cache hits and
preemption."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from tp_helpers import PROMPTS, alive, run_rounds, start_ranks

from family_models import tiny
from greedy_rounds import FewerBlocks
from sluiceway.runner.model_runner import TorchModelRunner
from sluiceway.runner.tensor_parallel import TensorParallelRunner


@pytest.fixture(scope="module", params=["phi3", "qwen3_moe", "gemma2"])
def case(request) -> Iterator[tuple[torch.nn.Module, TensorParallelRunner]]:
    model = tiny(request.param)
    runner = start_ranks(model, 2)
    try:
        yield model, runner
    finally:
        runner.close()
    assert not any(alive(pid) for pid in runner.rank_pids)


def test_two_ranks_match_one_device(case):
    model, runner = case
    one_device = TorchModelRunner(model.config, model.state_dict(), block_size=4, num_blocks=64)
    # 5 tokens a step: prompts prefilled in chunks; 12 blocks of 4 tokens cannot
    # hold every sequence at once; round two hits the prefix cache.
    want = run_rounds(FewerBlocks(one_device, 12), PROMPTS, budget=5, rounds=2)
    got = run_rounds(FewerBlocks(runner, 12), PROMPTS, budget=5, rounds=2)
    assert want[0].preemptions > 0 and want[1].cached[2] > 0
    assert got == want
