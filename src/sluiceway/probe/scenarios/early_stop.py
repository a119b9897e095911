"""One finished choice must not stall its siblings: with ``n=4`` and a stop string,
the first choice to stop ends early and the others must go on to their own end."""

from __future__ import annotations

from sluiceway.probe.context import (
    CHAT,
    Outcome,
    ProbeContext,
    UnsupportedError,
    refusal_means_unsupported,
)
from sluiceway.probe.record import StreamRecord
from sluiceway.probe.scenarios.checks import choice_problems

WAYS = 4
TOKENS = 64
PROMPT = "Write a few short sentences about a river, the sea and the rain."
# Common enough that sampled choices meet one early, each at its own place.
STOP = [" the", "."]
SEEDS = (11, 12, 13)


async def early_stop(ctx: ProbeContext) -> Outcome:
    """Up to three seeded tries until one choice stops strictly before a sibling;
    then every sibling still running must get output after that and finish."""
    tries = []
    for seed in SEEDS:
        rec = await _one_try(ctx, seed)
        problems = choice_problems(rec, WAYS)
        first = _first_stop(rec)
        tries.append(
            {
                "seed": seed,
                "finished_s": {
                    i: round(t.finished_at - rec.opened_at, 4)
                    for i, t in rec.choices.items()
                    if t.finished_at is not None
                },
                "finish_reasons": {i: t.finish_reason for i, t in rec.choices.items()},
                "output_entries": {i: len(t.times) for i, t in rec.choices.items()},
            }
        )
        ctx.numbers["tries"] = tries
        if problems:
            return Outcome(False, "; ".join(problems))
        if first is None:
            continue
        index, at = first
        siblings = [
            t for t in rec.choices.values() if t.finished_at is not None and t.finished_at > at
        ]
        if not siblings:
            continue
        # Count every entry after the first stop (a bare finish_reason included):
        # a sibling that was still running then and finished later was not stalled.
        after = {t.index: sum(1 for x in t.times if x > at) + 1 for t in siblings}
        ctx.numbers.update(stopped_first=index, sibling_entries_after=after)
        return Outcome(
            True,
            f"choice {index} stopped first; {len(siblings)} siblings went on "
            f"({sum(after.values())} more entries) and finished",
        )
    raise UnsupportedError(f"in {len(SEEDS)} tries no choice stopped on {STOP} before its siblings")


async def _one_try(ctx: ProbeContext, seed: int) -> StreamRecord:
    rec: StreamRecord | None = None

    def progress() -> str:
        if rec is None:
            return f"seed {seed}: waiting for the response to start"
        first = _first_stop(rec)
        waiting = rec.unfinished(WAYS)
        if first is None:
            return f"seed {seed}: no choice has stopped yet; finished {rec.finished()}"
        return f"seed {seed}: choice {first[0]} stopped; choices {waiting} never finished"

    ctx.progress = progress
    body = ctx.chat(PROMPT, TOKENS, n=WAYS, temperature=1.0, seed=seed, stop=STOP)
    with refusal_means_unsupported("a streamed chat request with n=4 and stop"):
        async with ctx.stream(CHAT, body) as (s, rec):
            await ctx.read(s, rec)
    return rec


def _first_stop(rec: StreamRecord) -> tuple[int, float] | None:
    stopped = [
        (t.finished_at, t.index)
        for t in rec.choices.values()
        if t.finish_reason == "stop" and t.finished_at is not None
    ]
    if not stopped:
        return None
    at, index = min(stopped)
    return index, at
