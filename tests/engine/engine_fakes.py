"""Test doubles for the engine: a byte tokenizer and a scripted model runner."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import attrs

from sluiceway.engine.batch import SampledToken, ScheduledChunk, StepBatch

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
