"""The reasoning fields on the wire: what the server writes parses in the openai
SDK's types with the thinking where vLLM puts it, and the requests decode."""

from __future__ import annotations

import json

import msgspec
import openai.types.chat as oa
import pytest

from sluiceway import protocol as p


def test_message_and_delta_carry_reasoning_content_only_when_there_is_some() -> None:
    message = p.ChatMessage(content="Paris.", reasoning_content="Capital of France.")
    assert list(message.to_dict()) == ["role", "content", "reasoning_content"]
    assert "reasoning_content" not in p.ChatMessage(content="Paris.").to_dict()
    chunk = p.ChatCompletionChunk(
        "c1", "m", [p.ChatCompletionChunkChoice(0, p.DeltaMessage(reasoning_content="Hm"))]
    )
    parsed = oa.ChatCompletionChunk.model_validate(json.loads(json.dumps(chunk.to_dict())))
    assert parsed.choices[0].delta.content is None
    assert parsed.choices[0].delta.model_extra == {"reasoning_content": "Hm"}
    assert p.ChatCompletionChunk.from_dict(chunk.to_dict()) == chunk


def test_usage_reports_reasoning_tokens_as_openai_does() -> None:
    usage = p.Usage(5, 9, 14, completion_tokens_details=p.CompletionTokensDetails(6))
    wire = usage.to_dict()
    assert wire["completion_tokens_details"] == {"reasoning_tokens": 6}
    completion = oa.ChatCompletion.model_validate(
        {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [],
            "usage": wire,
        }
    )
    assert completion.usage is not None and completion.usage.completion_tokens_details
    assert completion.usage.completion_tokens_details.reasoning_tokens == 6
    assert "completion_tokens_details" not in p.Usage(1, 1, 2).to_dict()


def test_reasoning_item_is_what_the_responses_api_names_it() -> None:
    from openai.types.responses import ResponseReasoningItem

    item = p.ReasoningItem("rs_1", [p.ReasoningText("Let me think.")])
    parsed = ResponseReasoningItem.model_validate(item.to_dict())
    assert parsed.summary == [] and parsed.content is not None
    assert parsed.content[0].text == "Let me think." and item.text == "Let me think."


def test_requests_take_template_kwargs_as_an_object_and_an_effort_by_name() -> None:
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "chat_template_kwargs": {"enable_thinking": False, "custom": [1, 2]},
        "reasoning_effort": "low",
        "max_reasoning_tokens": 64,
    }
    request = msgspec.convert(body, p.ChatCompletionRequest)
    assert request.chat_template_kwargs == {"enable_thinking": False, "custom": [1, 2]}
    assert (request.reasoning_effort, request.max_reasoning_tokens) == ("low", 64)
    for bad in ({"chat_template_kwargs": ["enable_thinking"]}, {"reasoning_effort": "max"}):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert({**body, **bad}, p.ChatCompletionRequest)
    response = msgspec.convert(
        {
            "input": "hi",
            "reasoning": {"effort": "high", "summary": "auto"},
            "chat_template_kwargs": {"enable_thinking": True},
        },
        p.ResponseCreateRequest,
    )
    assert response.reasoning == p.ReasoningOptions(effort="high", summary="auto")
