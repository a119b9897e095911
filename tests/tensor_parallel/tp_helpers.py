"""Shared by the tensor-parallel tests: tiny random Llamas, starting ranks (one
torch thread each: the 2-core CI machine runs up to four), and driving an
`EngineCore` through chunked prefill, prefix-cache hits and preemption."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from greedy_rounds import Run, greedy_rounds
from sluiceway.engine.pooling import PoolingSpec
from sluiceway.runner.tensor_parallel import TensorParallelRunner
from sluiceway.runner.tensor_parallel.driver import free_loopback_port
from sluiceway.runner.tensor_parallel.messages import RankSpec, WeightsSource
from tiny_models import TINY_LLAMA

PROMPTS = [
    [5, 17, 99, 3, 42, 8, 250, 11, 64, 7, 1, 2, 3],
    [200, 201],
    [9] * 21,
    [4, 8, 15, 16, 23, 42, 4, 8],
]
MAX_NEW = 12


def tiny_llama(*, kv_heads: int, vocab: int = 256, seed: int = 0, **overrides: Any) -> LlamaForCausalLM:
    """Random weights, sharper than the init so that greedy ties cannot decide."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        **dict(TINY_LLAMA, num_key_value_heads=kv_heads, **overrides),
        vocab_size=vocab,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    return model


def start_ranks(model: LlamaForCausalLM, size: int, **spec: Any) -> TensorParallelRunner:
    """Ranks over `model`'s weights on this machine, float32, one thread each."""
    options: dict[str, Any] = dict(block_size=4, num_blocks=64, torch_threads=1) | spec
    step_timeout = options.pop("step_timeout", None)
    weights = WeightsSource(model.config, dict(model.state_dict()), torch.float32)
    return TensorParallelRunner(
        RankSpec(world_size=size, init_method=free_loopback_port(), source=weights, **options),
        step_timeout=step_timeout,
        pooling=PoolingSpec("last", model.config.hidden_size),
    )


def run_rounds(runner: Any, prompts: list[list[int]], *, budget: int, rounds: int = 1) -> list[Run]:
    """Greedy `MAX_NEW` tokens for every prompt, batched, `rounds` times over on one
    engine core (the later rounds hit the prefix cache); `budget` tokens a step."""
    return greedy_rounds(runner, prompts, max_new=MAX_NEW, budget=budget, rounds=rounds)


def alive(pid: int) -> bool:
    """Whether process `pid` still runs: a zombie does not (its parent may be gone,
    and whoever reaps orphans here may be slow to)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def descendants(pid: int) -> list[int]:
    """Process ids of `pid`'s children, their children, and so on."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents.setdefault(int(stat.rpartition(")")[2].split()[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        found.extend(kids)
        todo.extend(kids)
    return found
