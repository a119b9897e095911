"""The seed: parallel streams that all start and finish, batch prompts streamed,
and ``n > 1`` streamed with each choice on its own index."""

from __future__ import annotations

import trio

from sluiceway.probe.context import (
    CHAT,
    COMPLETIONS,
    Outcome,
    ProbeContext,
    refusal_means_unsupported,
)
from sluiceway.probe.record import StreamRecord, peak_overlap
from sluiceway.probe.scenarios.checks import choice_problems, durations, first_output_s

WAYS = 4
TOKENS = 32
# Small models answer a request to count with one line; a story runs on.
PROMPT = "Write a long story about a river, a bridge and the sea."
PROMPTS = (
    "Count from one to fifty in words, separated by commas.",
    "List the months of the year, one per line.",
    "Name twenty animals, separated by commas.",
    "Write the alphabet with a word for each letter.",
)


async def parallel_streams(ctx: ProbeContext) -> Outcome:
    """Four streamed chat requests sent at once must all generate side by side and
    all finish (the seed: LMDeploy finished the first and never started the rest)."""
    records: list[StreamRecord] = []

    def progress() -> str:
        started = sum(1 for r in records if r.choices)
        done = sum(1 for r in records if r.done)
        return f"{len(records)}/{WAYS} streams opened, {started} started, {done} finished"

    ctx.progress = progress

    async def one() -> None:
        with refusal_means_unsupported("a streamed chat request"):
            async with ctx.stream(CHAT, ctx.chat(PROMPT, TOKENS, temperature=0)) as (s, rec):
                records.append(rec)
                await ctx.read(s, rec)

    async with trio.open_nursery() as nursery:
        for _ in range(WAYS):
            nursery.start_soon(one)
    overlap = peak_overlap(records)
    ctx.numbers.update(
        streams=WAYS,
        peak_overlap=overlap,
        first_output_s=[first_output_s(r) for r in records],
        duration_s=durations(records),
        output_entries=[sum(len(t.times) for t in r.choices.values()) for r in records],
    )
    problems = [p for r in records for p in choice_problems(r, 1)]
    if problems:
        return Outcome(False, "; ".join(sorted(set(problems))))
    if overlap < WAYS:
        return Outcome(
            False, f"at most {overlap} of {WAYS} parallel streams generated at once: serialised"
        )
    return Outcome(True, f"{WAYS} parallel streams generated side by side and all finished")


async def batch_prompts(ctx: ProbeContext) -> Outcome:
    """One streamed completions request with four prompts: every prompt's choice
    must stream on its own index, side by side, and finish."""
    body = ctx.completion(list(PROMPTS), TOKENS, temperature=0)
    request = "a streamed completions request with a list of prompts"
    return await _streamed_batch(ctx, COMPLETIONS, body, request, "prompts")


async def batch_chat(ctx: ProbeContext) -> Outcome:
    """The seed's own request: one streamed chat request whose ``messages`` is a
    list of four conversations, as the seed's reproduction sends it (an extension
    of OpenAI's API that sluiceway accepts; "not supported" where it is refused). Judged as
    ``batch_prompts``."""
    conversations = [[{"role": "user", "content": p}] for p in PROMPTS]
    body = {"model": ctx.model, "messages": conversations, "max_tokens": TOKENS, "temperature": 0}
    request = "a streamed chat request with a list of conversations"
    return await _streamed_batch(ctx, CHAT, body, request, "conversations")


async def _streamed_batch(
    ctx: ProbeContext, path: str, body: dict, request: str, kind: str
) -> Outcome:
    """`body` (one request of `len(PROMPTS)` prompts) streamed to `path` and judged
    choice by choice; "not supported" where `request` is refused."""
    rec: StreamRecord | None = None

    def progress() -> str:
        if rec is None:
            return "waiting for the response to start"
        return f"indices finished: {rec.finished()} of 0..{len(PROMPTS) - 1}"

    ctx.progress = progress
    with refusal_means_unsupported(request):
        async with ctx.stream(path, body) as (s, rec):
            await ctx.read(s, rec)
    return _judge_choices(ctx, rec, len(PROMPTS), kind)


async def n_choices(ctx: ProbeContext) -> Outcome:
    """One streamed chat request with ``n=4``: four indices, each its own text and
    one finish_reason, generated side by side (not multiplexed into index 0)."""
    rec: StreamRecord | None = None

    def progress() -> str:
        if rec is None:
            return "waiting for the response to start"
        return f"indices finished: {rec.finished()} of 0..{WAYS - 1}"

    ctx.progress = progress
    body = ctx.chat(PROMPT, TOKENS, n=WAYS, temperature=1.0, seed=7)
    with refusal_means_unsupported("a streamed chat request with n=4"):
        async with ctx.stream(CHAT, body) as (s, rec):
            await ctx.read(s, rec)
    ctx.numbers["distinct_texts"] = len({t.text for t in rec.choices.values()})
    return _judge_choices(ctx, rec, WAYS, "choices")


def _judge_choices(ctx: ProbeContext, rec: StreamRecord, expected: int, what: str) -> Outcome:
    overlap = rec.peak_overlap()
    ctx.numbers.update(
        expected_indices=expected,
        indices_seen=sorted(rec.choices),
        peak_overlap=overlap,
        chunks=rec.chunks,
        duplicate_entries=rec.duplicate_entries,
        first_output_s={
            i: round(t.first_at - rec.opened_at, 4)
            for i, t in rec.choices.items()
            if t.first_at is not None
        },
        finished_s={
            i: round(t.finished_at - rec.opened_at, 4)
            for i, t in rec.choices.items()
            if t.finished_at is not None
        },
        finish_reasons={i: t.finish_reasons for i, t in rec.choices.items()},
    )
    problems = choice_problems(rec, expected)
    if problems:
        return Outcome(False, "; ".join(problems))
    if overlap < expected:
        return Outcome(
            False, f"at most {overlap} of {expected} {what} generated at once: serialised"
        )
    return Outcome(
        True, f"{expected} {what} streamed on their own indices, side by side, all finished"
    )
