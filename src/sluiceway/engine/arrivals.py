"""Requests on their way to the engine, so that an idle engine's first step can
wait for the rest of a burst (`EngineConfig.burst_window`).

Parallel requests reach the server over a few milliseconds, and each then takes
the event loop a while (reading the body, the chat template, tokenizing) before
it is handed to the engine. The server brackets that stretch with `preparing()`,
from the moment a request is known to the moment it is ready to submit
(`Arrival.end`); the engine reports each hand-over with `arrived()`. `settle`
returns once nothing is being prepared and nothing new has begun or arrived for a
quiet period, which is when a burst has finished coming in. Everything here runs
on the event loop's thread: the counter needs no lock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import trio

# How long nothing new may have begun or reached the engine before an engine woken
# from idle takes its first step (`EngineConfig.burst_window`). Requests still
# being prepared hold the step regardless; this covers the gap between the
# requests of a burst, whose bytes reach the server a little apart. A lone request
# pays it once, before its first step.
BURST_QUIET = 0.0005


class Arrivals:
    """How many requests are being prepared, and a wake-up whenever one begins,
    ends its preparation or reaches the engine."""

    def __init__(self) -> None:
        self._preparing = 0
        self._news = trio.lowlevel.ParkingLot()

    @property
    def preparing_count(self) -> int:
        """Requests being prepared now."""
        return self._preparing

    @contextmanager
    def preparing(self) -> Iterator[Arrival]:
        """Bracket a request's preparation. The preparation ends at `Arrival.end`
        or when the block is left for any reason (an error or cancellation
        included), whichever is first."""
        arrival = Arrival(self)
        self._preparing += 1
        self._news.unpark_all()
        try:
            yield arrival
        finally:
            arrival.end()

    def _ended(self) -> None:
        self._preparing -= 1
        self._news.unpark_all()

    def arrived(self) -> None:
        """A request reached the engine (called by the engine on submission)."""
        self._news.unpark_all()

    async def settle(self, quiet: float) -> None:
        """Return once no request is being prepared and none has begun or arrived
        for `quiet` seconds (trio's clock, so a `MockClock` governs it). Never
        returns while a request is being prepared: the caller bounds the wait
        with its own deadline. Cancellation ends the wait and changes nothing."""
        while True:
            while self._preparing:
                await self._news.park()
            with trio.move_on_after(quiet) as quiet_period:
                await self._news.park()
            if quiet_period.cancelled_caught:
                return

    async def wait_for_burst(self, window: float) -> None:
        """Return once the burst has arrived (`settle` with `BURST_QUIET`), or after
        `window` seconds, whichever is first (at once for a window of 0).

        Called when a request wakes the idle engine. Requests sent in parallel
        reach it one after another; stepping at once would prefill the first
        alone while the others are still being read and tokenized, then the rest
        a step later, and every one of them would wait for both steps.
        Cancellation ends the wait like any other."""
        if window <= 0:
            return
        with trio.move_on_after(window):
            await self.settle(BURST_QUIET)


class Arrival:
    """One request's preparation (see `Arrivals.preparing`)."""

    def __init__(self, arrivals: Arrivals) -> None:
        self._arrivals: Arrivals | None = arrivals

    def end(self) -> None:
        """The request is ready to submit. Idempotent."""
        if self._arrivals is not None:
            arrivals, self._arrivals = self._arrivals, None
            arrivals._ended()
