"""A choice's text as Anthropic content blocks: thinking, text and tool uses
opened, added to and closed in order, the same blocks streamed or whole, and the
stop reasons."""

from __future__ import annotations

from typing import Any

import anthropic.types as at
import pydantic

from sluiceway.api.anthropic.blocks import BlockWriter
from sluiceway.api.anthropic.output import MessageOutput, stop_reason
from sluiceway.api.pipeline.tool_calls import ToolCallParser
from sluiceway.reasoning import FORMATS, ReasoningSplitter

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(at.RawMessageStreamEvent)


def output(tools: bool = True) -> MessageOutput:
    return MessageOutput(
        ReasoningSplitter.for_prompt(FORMATS["qwen3"], "fresh"),
        ToolCallParser() if tools else None,
    )


def run(out: MessageOutput, pieces: list[str]) -> list[dict[str, Any]]:
    events = [e for piece in pieces for e in out.feed(piece, 1)] + out.finish()
    wire = [e.to_dict() for e in events]
    for event in wire:
        EVENTS.validate_python(event)  # each one is an event the SDK reads
    return wire


def test_thinking_text_and_a_tool_use_in_order() -> None:
    text = "<think>\nadd them\n</think>\n\nSure.\n" + CALL
    out = output()
    events = run(out, [text[i : i + 3] for i in range(0, len(text), 3)])
    starts = [
        (e["index"], e["content_block"]["type"])
        for e in events
        if e["type"] == "content_block_start"
    ]
    stops = [e["index"] for e in events if e["type"] == "content_block_stop"]
    assert starts == [(0, "thinking"), (1, "text"), (2, "tool_use")] and stops == [0, 1, 2]
    # Each block's deltas come between its start and its stop.
    for index, kind in starts:
        first = events.index(next(e for e in events if e.get("index") == index))
        last = events.index(
            next(e for e in events if e["type"] == "content_block_stop" and e["index"] == index)
        )
        deltas = [e for e in events if e["type"] == "content_block_delta" and e["index"] == index]
        assert all(first < events.index(d) < last for d in deltas), kind
    thinking, said, use = out.writer.blocks
    assert thinking == {"type": "thinking", "thinking": "add them", "signature": ""}
    assert said == {"type": "text", "text": "Sure.\n"} or said == {"type": "text", "text": "Sure."}
    assert use["name"] == "add" and use["input"] == {"a": 1} and use["id"].startswith("toolu_")
    partial = "".join(
        e["delta"]["partial_json"]
        for e in events
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"
    )
    assert partial == '{"a": 1}'
    assert out.writer.has_tool_use and out.reasoning_tokens > 0


def test_streamed_and_whole_give_the_same_blocks() -> None:
    text = "<think>a</think>b" + CALL
    streamed, whole = output(), output()
    run(streamed, list(text))
    run(whole, [text])

    def without_ids(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in b.items() if k != "id"} for b in blocks]

    assert without_ids(streamed.writer.blocks) == without_ids(whole.writer.blocks)
    assert [b["type"] for b in whole.writer.blocks] == ["thinking", "text", "tool_use"]


def test_a_call_cut_short_leaves_its_input_empty() -> None:
    out = output()
    run(out, ["<think>x</think>" + CALL[:-20]])
    assert out.writer.blocks[-1]["type"] == "tool_use" and out.writer.blocks[-1]["input"] == {}


def test_text_only_without_tools() -> None:
    out = output(tools=False)
    run(out, ["Hello ", "<tool_call> is just text"])
    assert out.writer.blocks == [{"type": "text", "text": "Hello <tool_call> is just text"}]
    assert not out.writer.has_tool_use


def test_an_empty_output_has_no_blocks() -> None:
    writer = BlockWriter()
    assert writer.text("") == [] and writer.close() == [] and writer.blocks == []


def test_stop_reasons() -> None:
    assert stop_reason("stop", None, used_tools=False) == ("end_turn", None)
    assert stop_reason("stop", 2, used_tools=False) == ("end_turn", None)
    assert stop_reason("stop", "END", used_tools=False) == ("stop_sequence", "END")
    assert stop_reason("length", None, used_tools=True) == ("max_tokens", None)
    assert stop_reason("stop", None, used_tools=True) == ("tool_use", None)


def test_chat_field_names_become_the_messages_requests() -> None:
    from sluiceway.api.anthropic.errors import anthropic_error_body, messages_param
    from sluiceway.api.http.errors import APIError

    assert messages_param("tool_choice.function.name") == "tool_choice.name"
    assert messages_param("tools[2].function.parameters") == "tools[2].input_schema"
    assert messages_param("stop") == "stop_sequences" and messages_param("messages") == "messages"
    body = anthropic_error_body(
        APIError(400, "No such function.", param="tool_choice.function.name")
    )
    assert body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "tool_choice.name: No such function.",
        },
    }
