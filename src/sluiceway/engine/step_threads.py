"""Where all model work runs: one long-lived OS thread (`ModelThread`), or the event
loop's own thread (`CallingThread`).

torch's CPU kernels run on an OpenMP thread team that belongs to the OS thread
that calls them. Each calling thread gets its own team, and idle teams keep
spinning: on a small machine a second team (model loaded on the main thread,
steps run on a trio worker thread) made every decode step far slower
(`docs/benchmarks.md`, "Measurements behind choices in the code"). So loading
and warm-up run on one thread, and steps move to another only after the thread they leave has freed
its team (`sluiceway.runner.openmp_teams`, which the engine's builder hands it).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio

T = TypeVar("T")

_Job = tuple[Callable[[], Any], Callable[[outcome.Outcome[Any]], None]]


def _STOP() -> None:
    raise AssertionError("the stop sentinel is never run")


def _ignore(_: outcome.Outcome[Any]) -> None:
    pass


class ModelThread:
    """Runs submitted functions one at a time, in order, on a single daemon thread."""

    def __init__(self, name: str = "sluiceway-model") -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._start_lock = threading.Lock()

    def _put(self, job: _Job) -> None:
        with self._start_lock:  # started on first use, so an unused one costs nothing
            if not self._thread.is_alive() and self._thread.ident is None:
                self._thread.start()
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            fn, deliver = self._jobs.get()
            if fn is _STOP:
                return
            deliver(outcome.capture(fn))

    def stop(self) -> None:
        """Let the thread exit once the jobs already queued are done."""
        if self._thread.ident is not None:
            self._jobs.put((_STOP, _ignore))

    async def join(self) -> None:
        """Wait, from trio, until the thread has exited (at once if it never
        started); call `stop` first, and never while a job hangs. Cancellation
        waits too. Why it matters: a daemon thread that is still inside torch when
        the interpreter finalizes is ended by `pthread_exit` as it takes the GIL
        back, and that unwinding through torch's C++ frames aborts the whole
        process ("terminate called without an active exception", SIGABRT)."""
        if self._thread.ident is not None:
            await trio.to_thread.run_sync(self._thread.join)

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the model thread and wait for it (for code outside trio)."""
        if threading.current_thread() is self._thread:
            return fn()
        done = threading.Event()
        box: list[outcome.Outcome[T]] = []

        def deliver(result: outcome.Outcome[T]) -> None:
            box.append(result)
            done.set()

        self._put((fn, deliver))
        done.wait()
        return box[0].unwrap()

    async def run(self, fn: Callable[[], T], *, abandon_on_cancel: bool = False) -> T:
        """Run `fn` on the model thread from trio; returns or raises what it did.

        Like `trio.to_thread.run_sync`: cancellation waits for `fn` to finish, unless
        `abandon_on_cancel`, in which case the task is cancelled at once and `fn`'s
        result is dropped when it eventually arrives.
        """
        token = trio.lowlevel.current_trio_token()
        task = trio.lowlevel.current_task()
        abandoned = False

        def deliver(result: outcome.Outcome[T]) -> None:
            def resume() -> None:
                if not abandoned:
                    trio.lowlevel.reschedule(task, result)

            try:
                token.run_sync_soon(resume)
            except trio.RunFinishedError:
                pass  # the trio run ended while the job ran: nobody is waiting

        def abort(_: Any) -> trio.lowlevel.Abort:
            nonlocal abandoned
            if abandon_on_cancel:
                abandoned = True
                return trio.lowlevel.Abort.SUCCEEDED
            return trio.lowlevel.Abort.FAILED

        self._put((fn, deliver))
        return await trio.lowlevel.wait_task_rescheduled(abort)


class CallingThread:
    """Runs each function at once on the thread that asks: the event loop's own thread
    does all torch work (`EngineConfig.steps_on_event_loop`).

    With `ModelThread` every step costs two wake-ups across threads (the step to the
    model thread, its result back to the loop), and the loop's work for a token
    contends with the model thread for the GIL and the cores while the next step
    runs, a tenth of a small model's token at one stream on two cores
    (`docs/benchmarks.md`). Here the loop's work runs between steps instead, and
    nothing else answers while a step runs.
    """

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` now, on this thread."""
        return fn()

    async def run(self, fn: Callable[[], T], *, abandon_on_cancel: bool = False) -> T:
        """Let the tasks that are runnable now take their turn, then run `fn` on this
        thread, blocking the event loop until it returns; returns or raises what it
        did. trio runs each batch of runnable tasks in either order, so it takes two
        checkpoints before every task woken before the call has run. Cancellation
        raises at those checkpoints, before `fn` starts; `fn` itself is never
        interrupted, so `abandon_on_cancel` cannot apply and must be False."""
        if abandon_on_cancel:
            raise ValueError("a function running on the event loop cannot be abandoned")
        await trio.lowlevel.checkpoint()
        await trio.lowlevel.checkpoint()
        return fn()

    def stop(self) -> None:
        """Nothing to stop: there is no thread of its own."""

    async def join(self) -> None:
        """Nothing to wait for: there is no thread of its own."""


StepThread = ModelThread | CallingThread  # where an engine runs its steps
