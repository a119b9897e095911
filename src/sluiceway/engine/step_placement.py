"""Where each engine step runs: on the model thread under the watchdog, or, for a
small decode (`--event-loop-decode-max-seqs`), on the event loop's own thread,
which skips two cross-thread wake-ups per token. Moving between the two first
frees the OpenMP team of the thread left behind (the release the engine's builder
finds on the torch side, `sluiceway.runner.openmp_teams`), so that one team
exists at a time; without a release, steps never move."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sluiceway.engine.step_threads import CallingThread, ModelThread, StepThread
from sluiceway.engine.watchdog import StepWatchdog

T = TypeVar("T")


class StepPlacement:
    """Owns the model thread (stops it with `stop`/`join`) and picks the thread of
    each step."""

    def __init__(
        self,
        model_thread: StepThread,
        *,
        step_timeout: float | None,
        loop_decode_max_seqs: int,
        openmp_pool_release: Callable[[], None] | None,
    ) -> None:
        self.model_thread = model_thread
        self._event_loop_thread = CallingThread()
        self._steps_on: StepThread = model_thread  # the thread whose OpenMP team is live
        movable = isinstance(model_thread, ModelThread) and openmp_pool_release is not None
        self._pool_release = openmp_pool_release if movable else None
        self.loop_decode_max_seqs = loop_decode_max_seqs if movable else 0
        self.watchdog = StepWatchdog(model_thread, step_timeout)

    async def run(self, step: Callable[[], T], *, on_event_loop: bool) -> T | None:
        """`step()` where it belongs: on this (the event loop's) thread when
        `on_event_loop` and steps may move there, which blocks the loop for that
        step and cannot be abandoned; otherwise on the model thread under the
        watchdog. None if the watchdog fired."""
        if on_event_loop and self.loop_decode_max_seqs:
            await self._move_steps_to(self._event_loop_thread)
            return await self._event_loop_thread.run(step)
        await self._move_steps_to(self.model_thread)
        return await self.watchdog.run(step)

    async def _move_steps_to(self, thread: StepThread) -> None:
        """Free the OpenMP team of the thread steps leave, on that thread.
        Cancellation waits for the release, which takes well under a millisecond."""
        if thread is self._steps_on:
            return
        assert self._pool_release is not None
        await self._steps_on.run(self._pool_release)
        self._steps_on = thread

    def stop(self) -> None:
        self.model_thread.stop()

    async def join(self) -> None:
        """Wait for the model thread to exit, unless the watchdog left a step on it
        (it exits when that step returns)."""
        if not self.watchdog.abandoned:
            await self.model_thread.join()
