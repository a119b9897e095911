"""The Messages API's wire types: what the server writes is what Anthropic's own
SDK parses (its pydantic types), and requests decode with the ranges and the
required fields Anthropic documents."""

from __future__ import annotations

from typing import Any

import anthropic.types as at
import msgspec
import pydantic
import pytest

from sluiceway.protocol import anthropic as a

MESSAGE = a.Message(
    id="msg_1",
    model="m",
    content=[
        a.ThinkingBlock("2+2 is 4.").to_dict(),
        a.TextBlock("Four.").to_dict(),
        a.ToolUseBlock("toolu_1", "add", {"a": 2, "b": 2}).to_dict(),
    ],
    stop_reason="tool_use",
    usage=a.MessageUsage(12, 7, cache_read_input_tokens=4),
)


def test_a_message_parses_in_the_sdk() -> None:
    parsed = at.Message.model_validate(MESSAGE.to_dict())
    thinking, text, tool = parsed.content
    assert isinstance(thinking, at.ThinkingBlock) and thinking.thinking == "2+2 is 4."
    assert isinstance(text, at.TextBlock) and text.text == "Four."
    assert isinstance(tool, at.ToolUseBlock) and tool.input == {"a": 2, "b": 2}
    assert parsed.stop_reason == "tool_use" and parsed.usage.cache_read_input_tokens == 4


def without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


@pytest.mark.parametrize(
    "event",
    [
        a.MessageStart(a.Message(id="msg_1", model="m")),
        a.ContentBlockStart(0, a.ThinkingBlock("").to_dict()),
        a.ContentBlockDelta(0, a.thinking_delta("hm")),
        a.ContentBlockDelta(0, a.signature_delta("")),
        a.ContentBlockDelta(1, a.text_delta("Fo")),
        a.ContentBlockStart(2, a.ToolUseBlock("toolu_1", "add").to_dict()),
        a.ContentBlockDelta(2, a.input_json_delta('{"a": 2')),
        a.ContentBlockStop(2),
        a.MessageDelta(a.MessageDeltaBody("end_turn"), a.DeltaUsage(7)),
        a.MessageStop(),
    ],
    ids=lambda e: e.to_dict()["type"],
)
def test_stream_events_parse_in_the_sdk(event: a.MessageStart) -> None:
    adapter: pydantic.TypeAdapter[at.RawMessageStreamEvent] = pydantic.TypeAdapter(
        at.RawMessageStreamEvent
    )
    parsed = adapter.validate_python(event.to_dict())
    assert without_nulls(parsed.model_dump()) == without_nulls(event.to_dict())


def test_errors_take_the_type_of_their_status() -> None:
    assert a.ErrorResponse.for_status(400, "bad").to_dict() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "bad"},
    }
    assert a.ErrorResponse.for_status(401, "x").error.type == "authentication_error"
    assert a.ErrorResponse.for_status(429, "x").error.type == "rate_limit_error"
    assert a.ErrorResponse.for_status(503, "x").error.type == "overloaded_error"
    assert a.ErrorResponse.for_status(422, "x").error.type == "invalid_request_error"
    assert a.ErrorResponse.for_status(502, "x").error.type == "api_error"


BODY = {
    "model": "m",
    "max_tokens": 64,
    "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
    "messages": [
        {"role": "user", "content": "Add 2 and 2."},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "use the tool", "signature": ""},
                {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2, "b": 2}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "4"}],
                },
            ],
        },
    ],
    "tools": [{"name": "add", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "tool", "name": "add", "disable_parallel_tool_use": True},
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "metadata": {"user_id": "u1"},
    "stop_sequences": ["\n\nHuman:"],
    "temperature": 0.5,
    "top_k": 5,
}


def test_a_full_request_decodes() -> None:
    request = msgspec.convert(BODY, a.MessageCreateRequest)
    assert a.system_text(request.system) == "Be brief.\nBe kind."
    [user, assistant, result] = request.messages
    assert user.blocks()[0].text == "Add 2 and 2."
    assert [b.type for b in assistant.blocks()] == ["thinking", "tool_use"]
    assert result.blocks()[0].result_text() == "4"
    assert all(b.problem() is None for m in request.messages for b in m.blocks())
    assert request.tool_choice is not None and request.tool_choice.name == "add"
    assert request.thinking == a.ThinkingParam(type="enabled", budget_tokens=1024)


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"temperature": 1.5}, "temperature"),
        ({"tool_choice": {"type": "required"}}, "tool_choice"),
        ({"messages": [{"role": "system", "content": "x"}]}, "role"),
    ],
)
def test_bad_requests_name_the_field(change: dict, complaint: str) -> None:
    body = {k: v for k, v in {**BODY, **change}.items() if v is not None}
    with pytest.raises(msgspec.ValidationError, match=complaint):
        msgspec.convert(body, a.MessageCreateRequest)


def test_a_block_without_what_its_type_needs_says_so() -> None:
    block = msgspec.convert({"type": "tool_use", "id": "t", "input": {}}, a.ContentBlockParam)
    assert block.problem() == "a tool_use block needs `name`"
