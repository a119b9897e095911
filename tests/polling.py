"""Waiting for state that changes where no event can be awaited: on the far side
of a socket or a process, or on another thread. Each wait is bounded; the limit
only turns a hang into a failure, and no test's outcome depends on it."""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable

import trio

Predicate = Callable[[], bool | Awaitable[bool]]


async def eventually(
    predicate: Predicate, limit_s: float = 10.0, *, interval: float = 0.005, on_thread: bool = False
) -> None:
    """Return once `predicate()` holds, checking every `interval` seconds. An async
    predicate is awaited; a blocking one (an HTTP call to another process) runs on
    a worker thread with `on_thread`. Raises `trio.TooSlowError` after `limit_s`."""
    with trio.fail_after(limit_s):
        while True:
            held = await trio.to_thread.run_sync(predicate) if on_thread else predicate()
            if inspect.isawaitable(held):
                held = await held
            if held:
                return
            await trio.sleep(interval)


def eventually_blocking(
    predicate: Callable[[], bool], limit_s: float = 10.0, *, interval: float = 0.002
) -> None:
    """`eventually` for a test that runs no event loop (it blocks this thread)."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, f"not true within {limit_s} s"
        time.sleep(interval)
