"""Tool-call output parsing (streamed and whole) and the fallback prompt format."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sluiceway.api.pipeline.tool_calls import ToolCallParser, parse
from sluiceway.api.pipeline.tool_prompt import fallback_messages, template_knows_tools
from sluiceway.protocol import DeltaFunctionCall

CALL_A = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n</tool_call>'
CALL_B = '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'


def test_text_only_is_content() -> None:
    assert parse("Just words, < and > and <tool but no call.") == (
        "Just words, < and > and <tool but no call.",
        [],
    )


def test_calls_and_the_text_before_them() -> None:
    content, calls = parse("Let me check.\n" + CALL_A + "\n" + CALL_B)
    assert content == "Let me check."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": [1, 2]}),
        ("now", {}),
    ]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)


def test_only_calls_have_null_content() -> None:
    content, calls = parse(CALL_B)
    assert content is None and len(calls) == 1


def test_a_call_cut_short_stays_text() -> None:
    cut = CALL_A[:40]
    assert parse("Sure. " + cut) == ("Sure. " + cut, [])


def test_a_later_call_cut_short_is_dropped() -> None:
    content, calls = parse(CALL_A + "\n" + CALL_B[:30])
    assert content is None and [c.function.name for c in calls] == ["get_weather"]


def _stream(pieces: list[str]) -> tuple[str, dict[int, dict[str, Any]]]:
    parser = ToolCallParser()
    content = []
    calls: dict[int, dict[str, Any]] = {}
    for piece in pieces:
        text, deltas = parser.feed(piece)
        content.append(text)
        assert len({d.index for d in deltas}) == len(deltas), deltas  # one chunk's entries
        for d in deltas:
            assert d.function is not None
            if d.id is not None:
                assert d.index not in calls and d.function.name
                calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
            else:
                assert d.function.name is None and d.function.arguments
            calls[d.index]["arguments"] += d.function.arguments or ""
    content.append(parser.finish())
    return "".join(content), calls


@settings(max_examples=200, deadline=None)
@given(
    prefix=st.sampled_from(["", "Checking.", "a <b> c <tool", "x\n"]),
    cuts=st.lists(st.integers(0, 200), max_size=12),
)
def test_streamed_pieces_join_into_what_parse_gives(prefix: str, cuts: list[int]) -> None:
    text = prefix + CALL_A + "\n" + CALL_B
    bounds = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)], strict=True)]
    content, calls = _stream(pieces)
    whole_content, whole_calls = parse(text)
    assert content.strip() == (whole_content or "")
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in whole_calls
    ]


def test_one_feed_gives_one_delta_per_call() -> None:
    # A consumer that falls behind gets the engine's deltas joined into one text.
    parser = ToolCallParser()
    text = "Checking.\n" + CALL_A + "\n" + CALL_B
    content, deltas = parser.feed(text)
    assert content == "Checking.\n" and parser.finish() == ""
    assert [(d.index, d.type, d.function) for d in deltas] == [
        (0, "function", DeltaFunctionCall("get_weather", '{"city": "Paris", "days": [1, 2]}')),
        (1, "function", DeltaFunctionCall("now", "{}")),
    ]
    # A header and the first piece of the arguments, in one text: one entry.
    parser = ToolCallParser()
    assert parser.feed(CALL_A[:46]) == ("", [])
    (first,) = parser.feed(CALL_A[46:53])[1]
    assert first.id is not None and first.function == DeltaFunctionCall("get_weather", '{"ci')


def test_fallback_prompt_describes_tools_and_rewrites_calls() -> None:
    tools = [{"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "time?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "content": "12:00", "tool_call_id": "c1"},
    ]
    out = fallback_messages(messages, tools)
    assert out[0]["role"] == "system" and '"name": "now"' in out[0]["content"]
    assert out[2] == {"role": "assistant", "content": CALL_B.replace("now", "now")}
    assert out[3] == {"role": "user", "content": "<tool_response>\n12:00\n</tool_response>"}


def test_templates_that_read_tools_are_told_apart(tokenizer: Any) -> None:
    assert not template_knows_tools(tokenizer)  # the default model's ChatML template

    class WithTools:
        chat_template = "{% if tools %}{{ tools }}{% endif %}"

    assert template_knows_tools(WithTools())
