"""Greedy generation of a batch of prompts on one engine core, for parity tests
where the model is the point: every token and every prompt's cached share, per
round (the later rounds of the same prompts hit the prefix cache)."""

from __future__ import annotations

from typing import Any

import attrs

from sluiceway.engine.batch import SampledToken, StepBatch
from sluiceway.engine.core import EngineCore
from sluiceway.engine.sampling_params import SamplingParams


@attrs.frozen
class Run:
    tokens: list[list[int]]  # per prompt, in order
    cached: list[int]  # prompt tokens each prompt found in the prefix cache
    preemptions: int
    core: EngineCore = attrs.field(eq=False)  # the core itself, for its stats; runs compare by output


def bare_core(
    runner: Any, *, budget: int, max_seqs: int = 8, prefix: bool = True, max_model_len: int = 256
) -> EngineCore:
    """An engine core over `runner` with no detokenizer text and no end-of-sequence
    token, `budget` tokens a step."""
    return EngineCore(
        runner,
        lambda ids: "",
        max_num_seqs=max_seqs,
        max_num_batched_tokens=budget,
        eos_token_ids=[],
        max_model_len=max_model_len,
        enable_prefix_caching=prefix,
    )


def embed_all(
    core: EngineCore, prompts: list[list[int]], pooling: Any, first_request_id: int = 0
) -> list[tuple[float, ...]]:
    """Every prompt's embedding (`pooling`), in order, stepping `core` until it holds
    no work."""
    order = [
        core.add_request(first_request_id + i, p, SamplingParams(max_tokens=1), pooling=pooling)[0]
        for i, p in enumerate(prompts)
    ]
    got: dict[int, tuple[float, ...]] = {}
    for _ in range(10_000):
        if not core.has_work():
            return [got[s] for s in order]
        for seq_id, delta in core.step():
            if delta.embedding is not None:
                got[seq_id] = delta.embedding
    raise AssertionError("the engine did not finish")


def greedy_rounds(
    runner: Any,
    prompts: list[list[int]],
    *,
    max_new: int,
    budget: int,
    max_seqs: int = 8,
    prefix: bool = True,
    rounds: int = 1,
) -> list[Run]:
    """`max_new` greedy tokens for every prompt, batched, `rounds` times over on one
    engine core with `budget` tokens a step and no end-of-sequence token."""
    core = bare_core(runner, budget=budget, max_seqs=max_seqs, prefix=prefix)
    params = SamplingParams(max_tokens=max_new, temperature=0.0)
    runs = []
    for round_ in range(rounds):
        order = [core.add_request(round_ * 100 + i, p, params)[0] for i, p in enumerate(prompts)]
        tokens: dict[int, list[int]] = {}
        cached: dict[int, int] = {}
        before = core.scheduler.num_preemptions
        while core.has_work():
            for seq_id, delta in core.step():
                tokens.setdefault(seq_id, []).extend(delta.token_ids)
                cached[seq_id] = delta.num_cached_prompt_tokens
        runs.append(
            Run(
                [tokens[s] for s in order],
                [cached[s] for s in order],
                core.scheduler.num_preemptions - before,
                core,
            )
        )
    return runs


@attrs.frozen
class FewerBlocks:
    """A runner seen by the engine as having only `num_blocks` of its blocks: one set
    of ranks serves runs with and without KV-cache pressure."""

    runner: Any
    num_blocks: int

    @property
    def block_size(self) -> int:
        return int(self.runner.block_size)

    def step(self, batch: StepBatch) -> list[SampledToken]:
        return list(self.runner.step(batch))
