"""Fixtures for the probe's tests: a sluiceway server over a scripted runner whose
choices differ (so a stop string ends them at different places) and that follows
grammar masks when a request has them (tool calls, structured outputs)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
import pytest

from grammar_runner import MaskFollowingRunner
from sluiceway.api import RunningServer
from sluiceway.engine.batch import SampledToken, ScheduledChunk, StepBatch

STEP_S = 0.005


@attrs.define
class ChoiceRunner:
    """Unconstrained rows: ``vocab[(seq_id * 5 + position) % len(vocab)]``, never
    end of sequence, so the choices of one request differ and each meets a given
    word at its own place. A step with grammar masks is the mask-following
    runner's (the probe sends constrained requests alone)."""

    vocab: tuple[int, ...]
    masked: MaskFollowingRunner
    num_blocks: int = 1024
    block_size: int = 16

    def step(self, batch: StepBatch) -> list[SampledToken]:
        # A model's pace rather than a dictionary lookup's: a stream that the
        # probe hangs up on must not be able to reach max_tokens before the
        # abort lands. This runs in the engine's worker thread.
        time.sleep(STEP_S)
        if batch.token_masks is not None:
            return self.masked.step(batch)
        return [
            SampledToken(c.seq_id, self._token(c), -0.25, self._top(c))
            for c in batch.chunks
            if c.sample
        ]

    def _token(self, chunk: ScheduledChunk) -> int:
        position = chunk.start_pos + len(chunk.token_ids)
        return self.vocab[(chunk.seq_id * 5 + position) % len(self.vocab)]

    def _top(self, chunk: ScheduledChunk) -> tuple[tuple[int, float], ...]:
        return tuple((t, -1.0 - i) for i, t in enumerate(self.vocab[: chunk.params.logprobs or 0]))


@pytest.fixture
def choice_runner(tokenizer: Any, word_ids: tuple[int, ...]) -> ChoiceRunner:
    return ChoiceRunner(word_ids, MaskFollowingRunner(tokenizer))


@pytest.fixture
async def sluiceway_server(
    choice_runner: ChoiceRunner, serve_runner: Callable[..., Any]
) -> AsyncIterator[RunningServer]:
    async with serve_runner(choice_runner) as server:
        yield server
