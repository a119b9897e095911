"""A fault-injecting scripted model runner for the reliability tests.

Tokens are a function of the sequence alone (like tests/api/fakes.py), so any
batch, preemption or recompute gives the same text. Faults: a step that raises
(`fail_at_step`), a step that blocks until `release()` (`hang_at_step`), a gate
(`gated`: every step waits for a permit), and simulated model time
(`step_delay`, spent in the engine's worker thread, never on the event loop).
"""

from __future__ import annotations

import threading
import time

import attrs

from sluiceway.engine.batch import SampledToken, ScheduledChunk, StepBatch


@attrs.define
class FaultRunner:
    vocab: tuple[int, ...]
    eos: int
    num_blocks: int = 512
    block_size: int = 16
    fail_at_step: int | None = None
    hang_at_step: int | None = None
    gated: bool = False
    step_delay: float = 0.0
    steps: int = 0
    _permits: threading.Semaphore = attrs.field(factory=lambda: threading.Semaphore(0))
    _released: threading.Event = attrs.field(factory=threading.Event)

    def allow(self, steps: int = 1) -> None:
        self._permits.release(steps)

    def release(self) -> None:
        """Unblock every gated or hung step, for good (also the teardown)."""
        self._released.set()
        self._permits.release(1_000_000)

    def next_token(self, chunk: ScheduledChunk) -> int:
        position = chunk.start_pos + len(chunk.token_ids)
        return self.vocab[(chunk.token_ids[-1] + position) % len(self.vocab)]

    def step(self, batch: StepBatch) -> list[SampledToken]:
        self.steps += 1
        if self.gated and not self._released.is_set():
            self._permits.acquire()
        if self.hang_at_step is not None and self.steps >= self.hang_at_step:
            self._released.wait()
        if self.fail_at_step is not None and self.steps >= self.fail_at_step:
            raise RuntimeError("injected step failure")
        if self.step_delay:
            time.sleep(self.step_delay)  # simulated model time, in the worker thread
        return [
            SampledToken(c.seq_id, self.next_token(c), -0.5, ()) for c in batch.chunks if c.sample
        ]
