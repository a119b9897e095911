"""tp=3 on the default model (9 query heads, 3 KV heads: one KV head a rank) gives the
greedy tokens of one device, through chunked prefill, a prefix-cache hit and a
preemption. The ranks load the checkpoint themselves, as a served model's do."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from tp_helpers import alive, run_rounds

from greedy_rounds import FewerBlocks
from sluiceway.runner.loading import LoadedModel, load_model
from sluiceway.runner.model_runner import TorchModelRunner
from sluiceway.runner.tensor_parallel import TensorParallelRunner
from sluiceway.runner.tensor_parallel.driver import free_loopback_port
from sluiceway.runner.tensor_parallel.messages import CheckpointSource, RankSpec

pytestmark = pytest.mark.slow

TEXTS = [
    "The river flows under a quiet bridge and on to the sea, where",
    "Paris is the capital of",
    "List three prime numbers:",
    "The river flows under a quiet bridge and on to the sea, where",
]


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(None, "float32", progress=False)


@pytest.fixture(scope="module")
def ranks(loaded: LoadedModel) -> Iterator[TensorParallelRunner]:
    spec = RankSpec(
        world_size=3,
        init_method=free_loopback_port(),
        source=CheckpointSource(None, "float32"),
        block_size=4,
        num_blocks=64,
        torch_threads=1,
    )
    runner = TensorParallelRunner(spec)
    try:
        yield runner
    finally:
        runner.close()
    assert not any(alive(pid) for pid in runner.rank_pids)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """The one-device reference on one thread too: the three ranks already keep
    the CI machine's cores busy, and OpenMP threads that wait for a descheduled
    peer made the reference run 8x slower there."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
def test_tp3_matches_one_device_through_chunks_prefix_hits_and_preemption(
    loaded: LoadedModel, ranks: Any
) -> None:
    prompts = [list(loaded.tokenizer.encode(t)) for t in TEXTS]
    one = TorchModelRunner.from_loaded(loaded, block_size=4, num_blocks=64)
    # 8 tokens a step prefill the 15-token prompts in chunks; 12 blocks of 4 tokens
    # cannot hold all four sequences, so one is preempted; the repeated prompt and
    # the second round hit the prefix cache.
    want = run_rounds(FewerBlocks(one, 12), prompts, budget=8, rounds=2)
    got = run_rounds(FewerBlocks(ranks, 12), prompts, budget=8, rounds=2)
    assert max(len(p) for p in prompts) > 8
    assert want[0].preemptions > 0 and want[1].cached[0] > 0
    assert got == want
