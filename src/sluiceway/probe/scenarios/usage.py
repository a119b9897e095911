"""Usage and finish reasons consistent per choice, streamed and not."""

from __future__ import annotations

from typing import Any

from sluiceway.client import APIStatusError
from sluiceway.probe.context import (
    CHAT,
    UNSUPPORTED_STATUS,
    Outcome,
    ProbeContext,
    refusal_means_unsupported,
)
from sluiceway.probe.record import StreamRecord
from sluiceway.probe.scenarios.checks import FINISH_REASONS, choice_problems
from sluiceway.probe.scenarios.seed import PROMPT

WAYS = 2
TOKENS = 8


async def usage_finish(ctx: ProbeContext) -> Outcome:
    """``n=2``, ``max_tokens=8``, logprobs on (to count each choice's tokens)
    where the server takes them: streamed with ``include_usage`` and not
    streamed. Each choice has one finish_reason; "length" means exactly
    ``max_tokens`` tokens; usage adds up and matches the tokens the choices carry."""
    body = ctx.chat(PROMPT, TOKENS, n=WAYS, temperature=1.0, seed=5, logprobs=True)
    ctx.progress = "waiting for the streamed request to finish"
    rec, body = await _streamed(ctx, body)
    problems = choice_problems(rec, WAYS)
    counted = "logprobs" in body
    tokens = {i: t.logprob_tokens for i, t in rec.choices.items()}
    reasons = {i: t.finish_reason for i, t in rec.choices.items()}
    problems += [
        f"streamed: {p}" for p in _usage_problems(rec.usage, reasons, tokens if counted else None)
    ]
    if rec.usage_chunks > 1:
        problems.append(f"streamed: usage sent in {rec.usage_chunks} chunks")
    ctx.numbers.update(
        streamed={
            "usage": rec.usage,
            "finish_reasons": reasons,
            "tokens_by_logprobs": tokens if counted else None,
        },
        logprobs_counted=counted,
    )
    ctx.progress = "waiting for the non-streamed request"
    with refusal_means_unsupported("a chat request with n=2"):
        reply = await ctx.request_json(CHAT, body)
    choices = reply.get("choices") or []
    reasons = {int(c.get("index", -1)): c.get("finish_reason") for c in choices}
    tokens = {
        int(c.get("index", -1)): len(((c.get("logprobs") or {}).get("content")) or [])
        for c in choices
    }
    if sorted(reasons) != list(range(WAYS)):
        problems.append(f"non-streamed: indices {sorted(reasons)}")
    problems += [
        f"non-streamed: {p}"
        for p in _usage_problems(reply.get("usage"), reasons, tokens if counted else None)
    ]
    ctx.numbers["non_streamed"] = {
        "usage": reply.get("usage"),
        "finish_reasons": reasons,
        "tokens_by_logprobs": tokens if counted else None,
    }
    if problems:
        return Outcome(False, "; ".join(problems))
    how = "counted by logprobs" if counted else "logprobs refused: totals only"
    return Outcome(True, f"finish reasons and usage agree with each choice's tokens ({how})")


async def _streamed(ctx: ProbeContext, body: dict[str, Any]) -> tuple[StreamRecord, dict[str, Any]]:
    """The streamed request, with what the server refuses left out in turn:
    logprobs, then stream_options (then usage is not judged)."""
    streamed = {**body, "stream_options": {"include_usage": True}}
    for leave_out in ((), ("logprobs",), ("logprobs", "stream_options")):
        attempt = {k: v for k, v in streamed.items() if k not in leave_out}
        try:
            async with ctx.stream(CHAT, attempt) as (s, rec):
                await ctx.read(s, rec)
        except APIStatusError as exc:
            if exc.status_code not in UNSUPPORTED_STATUS or len(leave_out) == 2:
                with refusal_means_unsupported("a streamed chat request with n=2"):
                    raise
            continue
        ctx.numbers["left_out"] = list(leave_out)
        if "stream_options" not in attempt:
            rec.usage_chunks = max(rec.usage_chunks, 1)
            rec.usage = rec.usage or {"not_requested": True}
        kept = {k: v for k, v in body.items() if k not in leave_out}
        return rec, kept
    raise AssertionError("unreachable")


def _usage_problems(
    usage: dict[str, Any] | None, reasons: dict[int, str | None], tokens: dict[int, int] | None
) -> list[str]:
    problems = []
    for i, reason in sorted(reasons.items()):
        if reason not in FINISH_REASONS:
            problems.append(f"index {i} finish_reason {reason!r}")
        if tokens is not None:
            if tokens.get(i, 0) > TOKENS:
                problems.append(
                    f"index {i} carried {tokens[i]} tokens, more than max_tokens {TOKENS}"
                )
            if reason == "length" and tokens.get(i) != TOKENS:
                problems.append(
                    f"index {i} finished 'length' after {tokens.get(i)} of {TOKENS} tokens"
                )
    if usage is None:
        return [*problems, "no usage"]
    if usage.get("not_requested"):
        return problems
    prompt, completion, total = (
        usage.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")
    )
    if not all(isinstance(v, int) for v in (prompt, completion, total)):
        return [*problems, f"usage fields missing: {usage}"]
    assert isinstance(prompt, int) and isinstance(completion, int)
    if total != prompt + completion:
        problems.append(f"total_tokens {total} != {prompt} + {completion}")
    if prompt <= 0:
        problems.append(f"prompt_tokens {prompt}")
    if completion > WAYS * TOKENS:
        problems.append(f"completion_tokens {completion} > n x max_tokens {WAYS * TOKENS}")
    if tokens is not None and completion != sum(tokens.values()):
        problems.append(
            f"completion_tokens {completion} but the choices carried {sum(tokens.values())} tokens"
        )
    if (
        tokens is None
        and reasons
        and all(r == "length" for r in reasons.values())
        and completion != WAYS * TOKENS
    ):
        problems.append(
            f"every choice hit 'length' but completion_tokens is {completion}, not {WAYS * TOKENS}"
        )
    return problems
