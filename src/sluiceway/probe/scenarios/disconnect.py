"""A disconnect must free the work: judged by the server's own running count where
/metrics has one, else by the throughput the remaining stream gets back."""

from __future__ import annotations

from collections.abc import Callable

import trio

from sluiceway.probe.context import (
    CHAT,
    Outcome,
    ProbeContext,
    UnsupportedError,
    refusal_means_unsupported,
)
from sluiceway.probe.gauges import Gauges
from sluiceway.probe.record import StreamRecord
from sluiceway.probe.scenarios.seed import PROMPT

STREAMS = 4
DROPPED = 3
TOKENS = 256
WARM = 4  # output entries each dropped stream reads before it hangs up
WINDOW = 12  # entries of the kept stream over which its rate is measured
SETTLE = 2  # entries of the kept stream skipped after the drop
FREE_WITHIN_S = 5.0
POLL_S = 0.1
RECOVERY = 1.2  # the kept stream's rate must grow by this factor without /metrics


async def disconnect_frees_work(ctx: ProbeContext) -> Outcome:
    """Four streams; once each is generating, three hang up. The server's running
    count must fall by three within ``FREE_WITHIN_S``; without /metrics, the kept
    stream must speed up by ``RECOVERY`` (the dropped ones no longer share the
    work)."""
    start = await ctx.gauges()
    records: list[StreamRecord | None] = [None] * STREAMS
    scopes = [trio.CancelScope() for _ in range(STREAMS)]
    warm = [trio.Event() for _ in range(STREAMS)]
    target = [WINDOW + 1]  # kept-stream entries wanted before the next step
    reached = [trio.Event()]  # replaced for each wait

    def output(i: int) -> int:
        rec = records[i]
        trace = rec.choices.get(0) if rec is not None else None
        return len(trace.times) if trace is not None else 0

    async def one(i: int) -> None:
        def on_chunk(rec: StreamRecord, _: list[int]) -> None:
            if output(i) >= (WARM if i else target[0]) or (rec.chunks and rec.finished()):
                warm[i].set()
            if i == 0 and output(0) >= target[0]:
                reached[0].set()

        with scopes[i]:
            async with ctx.stream(CHAT, ctx.chat(PROMPT, TOKENS, temperature=0)) as (s, rec):
                records[i] = rec
                await ctx.read(s, rec, on_chunk)
        warm[i].set()
        if i == 0:
            reached[0].set()  # the kept stream ended: nothing more will come

    with refusal_means_unsupported("a streamed chat request"):
        async with trio.open_nursery() as nursery:
            for i in range(STREAMS):
                nursery.start_soon(one, i)
            ctx.progress = lambda: (
                f"waiting for {STREAMS} streams to start: {[output(i) for i in range(STREAMS)]} entries"
            )
            for event in warm:
                await event.wait()
            if any(r is None or r.finished() for r in records):
                nursery.cancel_scope.cancel()
                raise UnsupportedError("a stream ended before it could be dropped")
            at_drop = await ctx.gauges() if start is not None else None
            kept_before = output(0)
            for scope in scopes[1:]:
                scope.cancel()
            dropped_at = ctx.now()
            if at_drop is not None:
                left = TOKENS - max(output(i) for i in range(1, STREAMS))
                outcome = await _judge_by_gauges(
                    ctx, at_drop, dropped_at, lambda: output(0) - kept_before, left // 2
                )
            else:
                outcome = await _judge_by_rate(ctx, records[0], kept_before, target, reached)
            nursery.cancel_scope.cancel()
    return outcome


async def _judge_by_gauges(
    ctx: ProbeContext,
    at_drop: Gauges,
    dropped_at: float,
    kept_since: Callable[[], int],
    within_entries: int,
) -> Outcome:
    """Pass when the running gauge falls by the dropped streams within
    ``FREE_WITHIN_S`` and before the kept stream has made ``within_entries`` more
    entries: half what the dropped ones had left, so that, decoding on at the kept
    stream's pace, they could not have reached max_tokens and ended on their own."""
    name = f"{at_drop.source} running"
    ctx.numbers.update(
        gauge=at_drop.source, running_at_drop=at_drop.running, within_entries=within_entries
    )
    ctx.progress = f"waiting for {name} to fall below {at_drop.running:g}"
    readings = []
    with trio.move_on_after(FREE_WITHIN_S):
        while kept_since() < within_entries:
            now = await ctx.gauges()
            if now is None:
                break
            readings.append(now.running)
            if now.running <= at_drop.running - DROPPED:
                freed = round(ctx.now() - dropped_at, 4)
                ctx.numbers.update(running_after=readings, freed_s=freed)
                return Outcome(
                    True,
                    f"{name} fell {at_drop.running:g} -> {now.running:g} within {freed:.2f} s "
                    f"of {DROPPED} disconnects",
                )
            await trio.sleep(POLL_S)
    waited = round(ctx.now() - dropped_at, 4)
    entries = kept_since()
    # One more reading: the count may have fallen between the last poll and the
    # bound, and that is still in time.
    final = await ctx.gauges()
    if final is not None:
        readings.append(final.running)
        if final.running <= at_drop.running - DROPPED:
            ctx.numbers.update(running_after=readings, freed_s=waited)
            return Outcome(
                True,
                f"{name} fell {at_drop.running:g} -> {final.running:g} within {waited:.2f} s "
                f"of {DROPPED} disconnects",
            )
    ctx.numbers.update(running_after=readings, waited_s=waited, kept_entries_since=entries)
    last = readings[-1] if readings else at_drop.running
    return Outcome(
        False,
        f"{name} still {last:g} (was {at_drop.running:g}) {waited:.2f} s and "
        f"{entries} kept-stream entries after {DROPPED} of {STREAMS} streams "
        "disconnected: the work runs on",
    )


async def _judge_by_rate(
    ctx: ProbeContext,
    kept: StreamRecord | None,
    at: int,
    target: list[int],
    reached: list[trio.Event],
) -> Outcome:
    assert kept is not None
    times = kept.choices[0].times
    before = WINDOW / max(times[at - 1] - times[at - 1 - WINDOW], 1e-9)
    reached[0] = trio.Event()
    target[0] = at + SETTLE + WINDOW
    ctx.progress = f"waiting for the kept stream to reach {target[0]} entries after the drop"
    if len(times) < target[0]:
        await reached[0].wait()
    if kept.finished() and len(times) < target[0]:
        raise UnsupportedError("the kept stream ended before its rate could be measured")
    start = at + SETTLE - 1
    after = WINDOW / max(times[start + WINDOW] - times[start], 1e-9)
    ctx.numbers.update(gauge=None, rate_before=round(before, 3), rate_after=round(after, 3))
    verdict = after >= RECOVERY * before
    return Outcome(
        verdict,
        f"judged without /metrics gauges: the kept stream went {before:.1f} -> {after:.1f} entries/s after "
        f"{DROPPED} disconnects (needs x{RECOVERY:g})",
    )
