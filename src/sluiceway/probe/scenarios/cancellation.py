"""Client cancellation mid-stream, and a storm of connections opened and dropped:
afterwards the server must answer a new request and hold no leftover work."""

from __future__ import annotations

import trio

from sluiceway.client import APIStatusError
from sluiceway.probe.context import CHAT, Outcome, ProbeContext, refusal_means_unsupported
from sluiceway.probe.gauges import Gauges
from sluiceway.probe.record import StreamRecord
from sluiceway.probe.scenarios.checks import durations
from sluiceway.probe.scenarios.seed import PROMPT

ROUNDS = 4
TOKENS = 256
READ = 2  # output entries read before cancelling
STORM = 16
STORM_AT_ONCE = 8
FOLLOW_TOKENS = 8
SETTLE_WITHIN_S = 5.0
REFUSALS = (429, 503)
FOLLOW_TRIES = 3
MAX_RETRY_AFTER_S = 5.0
POLL_S = 0.1


async def client_cancel(ctx: ProbeContext) -> Outcome:
    """Four streams, one after another, each cancelled (a client timeout) after
    ``READ`` entries; then a new request must finish and the running count return
    to where it started."""
    start = await ctx.gauges()
    cancelled = 0
    for round_ in range(ROUNDS):
        ctx.progress = (
            f"after {cancelled} streams cancelled mid-stream, stream {round_ + 1} got no output"
        )
        with refusal_means_unsupported("a streamed chat request"):
            cancelled += await _cancel_after(ctx, READ)
    ctx.numbers["cancelled_mid_stream"] = cancelled
    return await _after_the_fact(ctx, start, f"{cancelled} streams cancelled mid-stream")


async def reconnect_storm(ctx: ProbeContext) -> Outcome:
    """Sixteen streams, eight at a time, each dropped at once: half as soon as the
    response starts, half after their first output. Then as ``client_cancel``."""
    start = await ctx.gauges()
    limiter = trio.CapacityLimiter(STORM_AT_ONCE)
    dropped = [0]
    refused: list[int] = []

    async def one(i: int) -> None:
        async with limiter:
            try:
                cancelled = await _cancel_after(ctx, i % 2)
            except APIStatusError as exc:
                # A refusal with 429/503 is the server guarding itself: an answer.
                if exc.status_code not in REFUSALS:
                    raise
                refused.append(exc.status_code)
                return
            dropped[0] += cancelled

    ctx.progress = lambda: f"storm: {dropped[0]} of {STORM} streams opened and dropped"
    with refusal_means_unsupported("a streamed chat request"):
        async with trio.open_nursery() as nursery:
            for i in range(STORM):
                nursery.start_soon(one, i)
    ctx.numbers.update(dropped=dropped[0], refused=refused)
    return await _after_the_fact(ctx, start, f"a storm of {STORM} dropped streams")


async def _cancel_after(ctx: ProbeContext, entries: int) -> int:
    """Open a stream and cancel it once it has ``entries`` output entries (0: as
    soon as the response starts); 1 if it was cancelled, 0 if it finished first."""
    with trio.CancelScope() as scope:
        async with ctx.stream(CHAT, ctx.chat(PROMPT, TOKENS, temperature=0)) as (s, rec):

            def on_chunk(rec: StreamRecord, _: list[int]) -> None:
                trace = rec.choices.get(0)
                if trace is not None and len(trace.times) >= entries:
                    scope.cancel()

            if entries == 0:
                scope.cancel()
            await ctx.read(s, rec, on_chunk)
    return int(scope.cancelled_caught)


async def _follow_up(ctx: ProbeContext) -> StreamRecord:
    """A short request after the cancellations; a 429/503 (the server still
    letting go) is retried after its Retry-After, ``FOLLOW_TRIES`` times in all."""
    for attempt in range(FOLLOW_TRIES):
        try:
            with refusal_means_unsupported("a streamed chat request"):
                body = ctx.chat(PROMPT, FOLLOW_TOKENS, temperature=0)
                async with ctx.stream(CHAT, body) as (s, rec):
                    await ctx.read(s, rec)
            return rec
        except APIStatusError as exc:
            if exc.status_code not in REFUSALS or attempt == FOLLOW_TRIES - 1:
                raise
            ctx.numbers.setdefault("follow_up_refused", []).append(exc.status_code)
            wait = getattr(exc, "retry_after", None)  # 429 and 503 carry it
            await trio.sleep(min(wait if wait is not None else 1.0, MAX_RETRY_AFTER_S))
    raise AssertionError("unreachable")


async def _after_the_fact(ctx: ProbeContext, start: Gauges | None, what: str) -> Outcome:
    ctx.progress = f"after {what}, a new request got no answer"
    rec = await _follow_up(ctx)
    follow = durations([rec])[0]
    ctx.numbers["follow_up_s"] = follow
    if start is None:
        return Outcome(True, f"after {what} a new request finished in {follow:.2f} s (no /metrics)")
    ctx.progress = (
        f"after {what}, waiting for {start.source} running+waiting to return to {start.busy:g}"
    )
    readings = []
    waited_from = ctx.now()
    with trio.move_on_after(SETTLE_WITHIN_S):
        while True:
            now = await ctx.gauges()
            if now is None:
                break
            readings.append(now.busy)
            if now.busy <= start.busy:
                settled = round(ctx.now() - waited_from, 4)
                ctx.numbers.update(
                    gauge=start.source,
                    busy_before=start.busy,
                    busy_after=readings,
                    settled_s=settled,
                )
                return Outcome(
                    True,
                    f"after {what} a new request finished in {follow:.2f} s and "
                    f"{start.source} running+waiting returned to {start.busy:g}",
                )
            await trio.sleep(POLL_S)
    ctx.numbers.update(gauge=start.source, busy_before=start.busy, busy_after=readings)
    last = readings[-1] if readings else float("nan")
    return Outcome(
        False,
        f"after {what}, {start.source} still counts {last:g} running+waiting "
        f"(was {start.busy:g}) {SETTLE_WITHIN_S:g} s later: work or slots leaked",
    )
