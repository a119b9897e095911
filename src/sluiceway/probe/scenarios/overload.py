"""Overload must be answered with 429/503 and Retry-After, not by queueing without
bound or hanging. The burst is small and stated; each stream is closed at its
first output."""

from __future__ import annotations

import attrs
import trio

from sluiceway.client import APIError, APIStatusError
from sluiceway.probe.context import CHAT, Outcome, ProbeContext
from sluiceway.probe.record import StreamRecord

BURST = 16
TOKENS = 16
QUEUE_BOUND_S = 10.0  # the longest a request may wait, unanswered, at this load


@attrs.define
class _Tally:
    started: list[float] = attrs.field(factory=list)  # seconds to first output
    refused: list[dict[str, object]] = attrs.field(factory=list)
    errors: list[str] = attrs.field(factory=list)


async def overload(ctx: ProbeContext) -> Outcome:
    """``BURST`` streamed requests at once. Each must, within the queue bound,
    either start (first output) or be refused with 429/503 carrying Retry-After."""
    bound = min(QUEUE_BOUND_S, ctx.bound_s * 0.6)
    tally = _Tally()
    ctx.progress = lambda: _summary(tally, bound)
    with trio.move_on_after(bound):
        async with trio.open_nursery() as nursery:
            for _ in range(BURST):
                nursery.start_soon(_one, ctx, tally)
    hung = BURST - len(tally.started) - len(tally.refused) - len(tally.errors)
    without_retry_after = [r for r in tally.refused if r["retry_after"] is None]
    ctx.numbers.update(
        sent=BURST,
        queue_bound_s=bound,
        started=len(tally.started),
        first_output_s=sorted(tally.started),
        refused=tally.refused,
        errors=tally.errors,
        unanswered=hung,
    )
    summary = _summary(tally, bound)
    if hung:
        return Outcome(
            False,
            f"{hung} of {BURST} neither started nor were refused within {bound:g} s: unbounded queueing ({summary})",
        )
    if without_retry_after:
        return Outcome(
            False, f"{len(without_retry_after)} refusals without Retry-After ({summary})"
        )
    if tally.errors:
        return Outcome(False, f"errors other than 429/503: {tally.errors[0]} ({summary})")
    if not tally.refused:
        return Outcome(True, f"not overloaded at {BURST} at once: {summary}")
    return Outcome(True, summary)


async def _one(ctx: ProbeContext, tally: _Tally) -> None:
    try:
        async with ctx.stream(CHAT, ctx.chat("Say hello.", TOKENS, temperature=0)) as (s, rec):

            def on_chunk(rec: StreamRecord, _: list[int]) -> None:
                trace = rec.choices.get(0)
                if trace is not None and trace.first_at is not None:
                    raise _Started(trace.first_at - rec.opened_at)

            try:
                await ctx.read(s, rec, on_chunk)
            except _Started as started:
                tally.started.append(round(started.seconds, 4))
                return
            tally.started.append(round((rec.closed_at or ctx.now()) - rec.opened_at, 4))
    except APIStatusError as exc:
        if exc.status_code in (429, 503):
            tally.refused.append(
                {"status": exc.status_code, "retry_after": exc.headers.get("retry-after")}
            )
        else:
            tally.errors.append(str(exc)[:160])
    except APIError as exc:
        tally.errors.append(f"{type(exc).__name__}: {exc}"[:160])


class _Started(Exception):
    """Raised out of the chunk callback at the first output: enough read."""

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.seconds = seconds


def _summary(tally: _Tally, bound: float) -> str:
    parts = [f"{BURST} sent at once"]
    if tally.started:
        parts.append(
            f"{len(tally.started)} started (slowest first output {max(tally.started):.2f} s)"
        )
    statuses = sorted({int(str(r["status"])) for r in tally.refused})
    if tally.refused:
        with_header = sum(1 for r in tally.refused if r["retry_after"] is not None)
        parts.append(f"{len(tally.refused)} refused {statuses} ({with_header} with Retry-After)")
    if tally.errors:
        parts.append(f"{len(tally.errors)} errors")
    return ", ".join(parts)
