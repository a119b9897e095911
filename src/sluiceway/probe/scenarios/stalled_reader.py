"""A reader that stops reading must not slow the other streams beyond a bound."""

from __future__ import annotations

from contextlib import AsyncExitStack

import trio

from sluiceway.client import APIStatusError
from sluiceway.probe.context import (
    CHAT,
    UNSUPPORTED_STATUS,
    Outcome,
    ProbeContext,
    refusal_means_unsupported,
)
from sluiceway.probe.record import StreamRecord
from sluiceway.probe.scenarios.checks import durations
from sluiceway.probe.scenarios.seed import PROMPT

OTHERS = 3
TOKENS = 32
# The stalled stream asks for many tokens with top logprobs, so its unread bytes
# fill the socket buffers (the probe's side is shrunk to a few KiB) while the
# others run; it is closed as soon as they are done.
STALL_TOKENS = 1024
STALL_LOGPROBS = 5
# With the stall, the others may take at most this many times as long as alone,
# plus a second for the noise of a shared server.
SLOWDOWN = 2.0
SLACK_S = 1.0


async def stalled_reader(ctx: ProbeContext) -> Outcome:
    """Three streams alone (the baseline), then the same three beside a stream
    whose reader never reads after the headers, started ``head_start_s`` earlier."""
    ctx.progress = "baseline: three streams alone"
    with refusal_means_unsupported("a streamed chat request"):
        alone = await _others(ctx)
    baseline = max(durations(alone))
    bound = SLOWDOWN * baseline + SLACK_S
    head_start = min(2.0, ctx.bound_s / 8)
    ctx.numbers.update(
        baseline_s=durations(alone), bound_s=round(bound, 4), head_start_s=head_start
    )
    beside: list[StreamRecord] = []

    def progress() -> str:
        done = sum(1 for r in beside if r.done)
        return (
            f"with one reader stalled, {done}/{OTHERS} other streams finished "
            f"(alone they took {baseline:.2f} s)"
        )

    async with ctx.small_buffer_client() as stalled_client, AsyncExitStack() as stalled:
        # Never read: leaving the block closes it, which is its disconnect.
        body = ctx.chat(PROMPT, STALL_TOKENS, temperature=0)
        try:
            with_logprobs = {**body, "logprobs": True, "top_logprobs": STALL_LOGPROBS}
            await stalled.enter_async_context(
                ctx.stream(CHAT, with_logprobs, client=stalled_client)
            )
            ctx.numbers["stalled_logprobs"] = True
        except APIStatusError as exc:
            if exc.status_code not in UNSUPPORTED_STATUS:
                raise
            await stalled.enter_async_context(ctx.stream(CHAT, body, client=stalled_client))
            ctx.numbers["stalled_logprobs"] = False
        await trio.sleep(head_start)
        ctx.progress = progress
        with trio.move_on_after(bound):
            await _others(ctx, beside)
    taken = durations(beside)
    ctx.numbers["with_stall_s"] = taken
    if len(taken) < OTHERS:
        return Outcome(
            False,
            f"with one reader stalled, {OTHERS - len(taken)} of {OTHERS} streams did not finish "
            f"within {bound:.2f} s (alone: {baseline:.2f} s)",
        )
    slowest = max(taken)
    verdict = slowest <= bound
    return Outcome(
        verdict,
        f"beside a stalled reader the others took {slowest:.2f} s, alone {baseline:.2f} s "
        f"(bound {bound:.2f} s)",
    )


async def _others(
    ctx: ProbeContext, records: list[StreamRecord] | None = None
) -> list[StreamRecord]:
    records = [] if records is None else records

    async def one() -> None:
        async with ctx.stream(CHAT, ctx.chat(PROMPT, TOKENS, temperature=0)) as (s, rec):
            records.append(rec)
            await ctx.read(s, rec)

    async with trio.open_nursery() as nursery:
        for _ in range(OTHERS):
            nursery.start_soon(one)
    return records
