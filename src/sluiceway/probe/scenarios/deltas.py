"""Tool-call and structured-output deltas well-formed: one entry per choice index
per chunk, tool calls that start with id, type and name, and JSON that parses."""

from __future__ import annotations

import json
from typing import Any

from sluiceway.probe.context import CHAT, Outcome, ProbeContext, refusal_means_unsupported
from sluiceway.probe.record import StreamRecord, tool_call_problems
from sluiceway.probe.scenarios.checks import choice_problems

WAYS = 2
TOKENS = 64
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


async def tool_call_deltas(ctx: ProbeContext) -> Outcome:
    """``n=2`` streamed with a named ``tool_choice``: every choice streams one
    well-formed call."""
    body = ctx.chat(
        "What is the weather in Paris?",
        TOKENS,
        n=WAYS,
        temperature=0.7,
        seed=3,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    rec = await _read(ctx, body, "a streamed chat request with a named tool_choice")
    problems = choice_problems(rec, WAYS)
    for i, trace in sorted(rec.choices.items()):
        problems += [f"index {i}: {p}" for p in tool_call_problems(trace)]
    ctx.numbers.update(
        chunks=rec.chunks,
        duplicate_entries=rec.duplicate_entries,
        tool_deltas={i: len(t.tool_deltas) for i, t in rec.choices.items()},
        finish_reasons={i: t.finish_reason for i, t in rec.choices.items()},
    )
    if problems:
        return Outcome(False, "; ".join(problems))
    return Outcome(
        True, f"{WAYS} choices each streamed a well-formed call, one entry per index per chunk"
    )


async def structured_output_deltas(ctx: ProbeContext) -> Outcome:
    """``n=2`` streamed with a JSON-schema ``response_format``: each choice's
    text is one JSON object of the schema, delivered one entry per index per chunk."""
    body = ctx.chat(
        "Is water wet? Answer in JSON.",
        TOKENS,
        n=WAYS,
        temperature=0.7,
        seed=3,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True},
        },
    )
    rec = await _read(ctx, body, "a streamed chat request with a json_schema response_format")
    problems = choice_problems(rec, WAYS)
    for i, trace in sorted(rec.choices.items()):
        problems += [f"index {i}: {p}" for p in _answer_problems(trace.text)]
    ctx.numbers.update(
        chunks=rec.chunks,
        duplicate_entries=rec.duplicate_entries,
        texts={i: t.text for i, t in rec.choices.items()},
        finish_reasons={i: t.finish_reason for i, t in rec.choices.items()},
    )
    if problems:
        return Outcome(False, "; ".join(problems))
    return Outcome(
        True, f"{WAYS} choices each streamed JSON of the schema, one entry per index per chunk"
    )


async def _read(ctx: ProbeContext, body: dict[str, Any], what: str) -> StreamRecord:
    rec: StreamRecord | None = None
    ctx.progress = lambda: (
        "waiting for the response" if rec is None else f"finished indices {rec.finished()}"
    )
    with refusal_means_unsupported(what):
        async with ctx.stream(CHAT, body) as (s, rec):
            await ctx.read(s, rec)
    return rec


def _answer_problems(text: str) -> list[str]:
    try:
        value = json.loads(text)
    except ValueError:
        return [f"text is not JSON: {text[:80]!r}"]
    if not isinstance(value, dict) or set(value) != {"ok"} or not isinstance(value["ok"], bool):
        return [f"JSON does not match the schema: {text[:80]!r}"]
    return []
