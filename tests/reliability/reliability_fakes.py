"""A fault-injecting scripted model runner for the reliability tests.

Tokens are a function of the sequence alone (like tests/api/fakes.py), so any
batch, preemption or recompute gives the same text. Faults: a step that raises
(`fail_at_step`), a step that blocks until `release()` (`hang_at_step`), a gate
(`gated`: every step waits for a permit), and simulated model time
(`step_delay`, spent in the engine's worker thread, never on the event loop).
"""

from __future__ import annotations

import time

import attrs

from server_helpers import StepGate, scripted_token
from sluiceway.engine.batch import SampledToken, StepBatch


@attrs.define
class FaultRunner(StepGate):
    vocab: tuple[int, ...]
    eos: int
    num_blocks: int = 512
    block_size: int = 16
    fail_at_step: int | None = None
    hang_at_step: int | None = None
    step_delay: float = 0.0
    steps: int = 0

    def step(self, batch: StepBatch) -> list[SampledToken]:
        self.steps += 1
        self.wait_for_permit()
        if self.hang_at_step is not None and self.steps >= self.hang_at_step:
            self.wait_until_open()  # release() unblocks a hung step, for good
        if self.fail_at_step is not None and self.steps >= self.fail_at_step:
            raise RuntimeError("injected step failure")
        if self.step_delay:
            time.sleep(self.step_delay)  # simulated model time, in the worker thread
        return [
            SampledToken(c.seq_id, scripted_token(self.vocab, c), -0.5, ())
            for c in batch.chunks
            if c.sample
        ]
