"""The step watchdog: a model step that outruns `--step-timeout` is abandoned,
so that a hung kernel fails the engine instead of every request waiting on it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import trio

from sluiceway.engine.step_threads import StepThread

T = TypeVar("T")


class StepWatchdog:
    """Runs steps on one thread under a time limit. `abandoned` turns True once a
    step was left running there."""

    def __init__(self, thread: StepThread, timeout: float | None) -> None:
        self.thread = thread
        self.timeout = timeout
        self.abandoned = False

    async def run(self, step: Callable[[], T]) -> T | None:
        """`step()` on the thread; None if it outran the timeout.

        A thread cannot be interrupted, so a hung step is abandoned: the caller
        stops using what the step touches and fails, rather than leaving every
        request waiting. Only the watchdog abandons a step: cancellation from
        outside waits for it (the shield), since a step abandoned at shutdown
        would still be running torch while the interpreter exits, which aborts
        the process.
        """
        if self.timeout is None:
            return await self.thread.run(step)
        with trio.CancelScope(deadline=trio.current_time() + self.timeout, shield=True):
            return await self.thread.run(step, abandon_on_cancel=True)
        self.abandoned = True
        return None
