"""Test doubles for the engine: a byte tokenizer and a scripted model runner."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from sluiceway.engine.batch import SampledToken, ScheduledChunk, StepBatch
from sluiceway.engine.core import EngineCore
from sluiceway.engine.outputs import ChoiceDelta
from sluiceway.engine.pooling import PooledHidden, PoolingSpec

EOS = 256


class ByteTokenizer:
    """Token ids 0-255 are UTF-8 bytes; 256 is EOS (a special token)."""

    eos_token_id = EOS

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        data = bytes(i for i in ids if i < 256)
        return data.decode("utf-8", errors="replace")


def next_byte(chunk: ScheduledChunk) -> int:
    """Default script: the byte after the chunk's last token, wrapping in a-z."""
    last = chunk.token_ids[-1]
    return ord("a") + (last - ord("a") + 1) % 26 if last < 256 else ord("a")


@attrs.define
class ScriptedRunner:
    """A model runner whose next token is `script(chunk)`.

    Records every batch it ran. `gate`, when set, makes each step wait on it
    (a threading.Event the test sets), to hold a step in flight; `entered` is set
    once a step has begun. `fail_on_step`
    makes that step (0-based) raise. `wait_before_step` maps a step index to an
    event that step waits for (failing the step if it is not set within 10 s).
    """

    num_blocks: int = 64
    block_size: int = 4
    script: Callable[[ScheduledChunk], int] = next_byte
    batches: list[StepBatch] = attrs.field(factory=list)
    gate: threading.Event | None = None
    fail_on_step: int | None = None
    entered: threading.Event = attrs.field(factory=threading.Event)
    wait_before_step: dict[int, threading.Event] = attrs.field(factory=dict)

    def step(self, batch: StepBatch) -> list[SampledToken]:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait()
        step_index = len(self.batches)
        awaited = self.wait_before_step.get(step_index)
        if awaited is not None and not awaited.wait(timeout=10):
            raise RuntimeError(f"step {step_index} waited 10 s for its event")
        self.batches.append(batch)
        if self.fail_on_step == step_index:
            raise RuntimeError("scripted step failure")
        return [
            SampledToken(c.seq_id, self.script(c), -0.5)
            for c in batch.chunks
            if c.sample
        ]


@attrs.define
class PoolingScriptedRunner(ScriptedRunner):
    """A `ScriptedRunner` that also pools: a token's "hidden state" is (its id, its
    position, 1.0), so a mean over a prompt is (mean id, mean position, 1.0) and
    a last is (last id, last position, 1.0): any chunk counted twice or missed
    shows."""

    pooling: PoolingSpec = attrs.field(factory=lambda: PoolingSpec("mean", 3))

    def step_pooled(self, batch: StepBatch) -> tuple[list[SampledToken], list[PooledHidden]]:
        samples = self.step(batch)
        pooled = []
        for c in batch.chunks:
            rows = [(float(t), float(c.start_pos + i), 1.0) for i, t in enumerate(c.token_ids)]
            if c.pooling == "last":
                rows = rows[-1:]
            if c.pooling is not None:
                sums = tuple(float(sum(col)) for col in zip(*rows, strict=True))
                pooled.append(PooledHidden(c.seq_id, sums))
        return samples, pooled


def core_over(
    runner: ScriptedRunner,
    *,
    max_num_seqs: int = 8,
    budget: int = 16,
    max_model_len: int = 256,
    prefix: bool = True,
    **options: Any,
) -> EngineCore:
    """An engine core over `runner` and the byte tokenizer, `budget` tokens a step;
    `options` are the core's other keyword arguments."""
    return EngineCore(
        runner,
        ByteTokenizer().decode,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        eos_token_ids=[EOS],
        max_model_len=max_model_len,
        enable_prefix_caching=prefix,
        **options,
    )


def drain(core: EngineCore, max_steps: int = 10_000) -> dict[int, list[ChoiceDelta]]:
    """Step `core` until it holds no work; every sequence's deltas, in order."""
    outputs: dict[int, list[ChoiceDelta]] = {}
    for _ in range(max_steps):
        if not core.has_work():
            return outputs
        for seq_id, delta in core.step():
            outputs.setdefault(seq_id, []).append(delta)
    raise AssertionError(f"the engine did not finish in {max_steps} steps")
