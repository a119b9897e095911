"""`POST /v1/messages` and `/v1/messages/count_tokens` through Anthropic's own
Python SDK: a message, a streamed one and its final message, stop reasons, a tool
use round trip, token counts, and errors as the SDK's exception types."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio
import trio.testing

import anthropic
from server_helpers import RawStream, engine_empty, finished

from .conftest import MODEL, in_thread, sdk

HELLO = "Hello from the river."
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ASK = [{"role": "user", "content": "Say hello."}]


async def test_create_answers_a_message(serve_texts: Any, tokenizer: Any) -> None:
    async with serve_texts([HELLO]) as (server, _):
        client = sdk(server)
        message = await in_thread(
            lambda: client.messages.create(
                model=MODEL, max_tokens=64, system="Be brief.", messages=ASK
            )
        )
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.model == MODEL
    [block] = message.content
    assert isinstance(block, anthropic.types.TextBlock) and block.text == HELLO
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    assert message.usage.output_tokens == len(tokenizer.encode(HELLO, add_special_tokens=False)) + 1
    prompt = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, *ASK],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert message.usage.input_tokens == len(tokenizer.encode(prompt, add_special_tokens=False))


async def test_stream_and_its_final_message(serve_texts: Any) -> None:
    async with serve_texts([HELLO]) as (server, _):
        client = sdk(server)

        def streamed() -> tuple[list[str], str, anthropic.types.Message]:
            with client.messages.stream(model=MODEL, max_tokens=64, messages=ASK) as stream:
                kinds = []
                text = []
                for event in stream:
                    kinds.append(event.type)
                    if event.type == "text":
                        text.append(event.text)
                return kinds, "".join(text), stream.get_final_message()

        kinds, text, final = await in_thread(streamed)
    assert text == HELLO
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds[1] == "content_block_start" and "content_block_stop" in kinds
    assert kinds[-2] == "message_delta"
    assert [b.type for b in final.content] == ["text"] and final.content[0].text == HELLO  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0


async def test_raw_events_follow_anthropics_order(serve_texts: Any) -> None:
    async with serve_texts([HELLO]) as (server, _), httpx.AsyncClient(base_url=server.url) as http:
        body = {"model": MODEL, "max_tokens": 64, "messages": ASK, "stream": True}
        async with http.stream("POST", "/v1/messages", json=body, timeout=30) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = [line async for line in response.aiter_lines()]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    data = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert [d["type"] for d in data] == names  # each event's name is its type
    assert names[:3] == ["message_start", "content_block_start", "ping"] or names[:3] == [
        "message_start",
        "ping",
        "content_block_start",
    ]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert data[0]["message"]["content"] == [] and data[0]["message"]["stop_reason"] is None
    assert data[-2]["delta"]["stop_reason"] == "end_turn"
    assert "".join(d["delta"]["text"] for d in data if d["type"] == "content_block_delta") == HELLO


@pytest.mark.parametrize(
    ("kwargs", "reason", "sequence"),
    [
        ({"stop_sequences": ["river"]}, "stop_sequence", "river"),
        ({"max_tokens": 2}, "max_tokens", None),
    ],
)
async def test_stop_reasons(
    serve_texts: Any, kwargs: dict, reason: str, sequence: str | None
) -> None:
    async with serve_texts([HELLO]) as (server, _):
        client = sdk(server)
        message = await in_thread(
            lambda: client.messages.create(
                **{"model": MODEL, "max_tokens": 64, "messages": ASK, **kwargs}
            )
        )
    assert (message.stop_reason, message.stop_sequence) == (reason, sequence)
    if sequence:
        assert message.content[0].text == "Hello from the "  # type: ignore[union-attr]


async def test_tool_use_round_trip(serve_texts: Any) -> None:
    async with serve_texts([CALL, "It is sunny in Paris."]) as (server, _):
        client = sdk(server)
        ask = [{"role": "user", "content": "Weather in Paris?"}]
        first = await in_thread(
            lambda: client.messages.create(
                model=MODEL,
                max_tokens=128,
                messages=ask,
                tools=[WEATHER],
                extra_body={"temperature": 0},
            )
        )
        assert first.stop_reason == "tool_use"
        [use] = [b for b in first.content if b.type == "tool_use"]
        assert isinstance(use, anthropic.types.ToolUseBlock)
        assert (use.name, use.input) == ("get_weather", {"city": "Paris"})
        assert use.id.startswith("toolu_")
        second = await in_thread(
            lambda: client.messages.create(
                model=MODEL,
                max_tokens=128,
                tools=[WEATHER],
                messages=[
                    *ask,
                    {"role": "assistant", "content": first.content},
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21 C"}
                        ],
                    },
                ],
            )
        )
    assert second.stop_reason == "end_turn"
    assert second.content[0].text == "It is sunny in Paris."  # type: ignore[union-attr]


async def test_a_streamed_tool_use_arrives_as_input_json(serve_texts: Any) -> None:
    async with serve_texts([CALL]) as (server, _):
        client = sdk(server)

        def streamed() -> tuple[list[str], anthropic.types.Message]:
            with client.messages.stream(
                model=MODEL,
                max_tokens=128,
                tools=[WEATHER],
                extra_body={"temperature": 0},
                tool_choice={"type": "any"},
                messages=[{"role": "user", "content": "Paris?"}],
            ) as stream:
                deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
                return deltas, stream.get_final_message()

        deltas, final = await in_thread(streamed)
    assert deltas and set(deltas) == {"input_json_delta"}
    [use] = final.content
    assert use.type == "tool_use" and use.input == {"city": "Paris"}
    assert final.stop_reason == "tool_use"


async def test_count_tokens_counts_what_create_reads(serve_texts: Any) -> None:
    async with serve_texts([HELLO]) as (server, _):
        client = sdk(server)
        counted = await in_thread(
            lambda: client.messages.count_tokens(model=MODEL, messages=ASK, system="Be brief.")
        )
        with_tools = await in_thread(
            lambda: client.messages.count_tokens(model=MODEL, messages=ASK, tools=[WEATHER])
        )
        message = await in_thread(
            lambda: client.messages.create(
                model=MODEL, max_tokens=8, messages=ASK, system="Be brief."
            )
        )
    assert counted.input_tokens == message.usage.input_tokens > 0
    assert with_tools.input_tokens > counted.input_tokens  # the tools are in the prompt


async def test_errors_are_the_sdks_exception_types(serve_texts: Any) -> None:
    async with serve_texts([HELLO], api_keys=("secret",)) as (server, _):
        good, bad = sdk(server, "secret"), sdk(server, "wrong")
        ok = await in_thread(lambda: good.messages.create(model=MODEL, max_tokens=4, messages=ASK))
        assert ok.content  # x-api-key, the SDK's own header, is accepted
        with pytest.raises(anthropic.AuthenticationError) as auth:
            await in_thread(lambda: bad.messages.create(model=MODEL, max_tokens=4, messages=ASK))
        with pytest.raises(anthropic.NotFoundError) as missing:
            await in_thread(lambda: good.messages.create(model="other", max_tokens=4, messages=ASK))
        with pytest.raises(anthropic.BadRequestError) as invalid:
            await in_thread(
                lambda: good.messages.create(
                    model=MODEL, max_tokens=4, messages=ASK, extra_body={"temperature": 1.5}
                )
            )
        with pytest.raises(anthropic.BadRequestError) as image:
            await in_thread(
                lambda: good.messages.create(
                    model=MODEL,
                    max_tokens=4,
                    messages=[
                        {
                            "role": "user",
                            "content": [
                                {
                                    "type": "image",
                                    "source": {
                                        "type": "base64",
                                        "media_type": "image/png",
                                        "data": "AAAA",
                                    },
                                }
                            ],
                        }
                    ],
                )
            )
    assert auth.value.status_code == 401
    assert auth.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": auth.value.body["error"]["message"]},
    }  # type: ignore[index]
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert invalid.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "temperature" in invalid.value.body["error"]["message"]  # type: ignore[index]
    assert "image" in image.value.body["error"]["message"]  # type: ignore[index]


async def test_bad_bodies_are_anthropic_errors(serve_texts: Any) -> None:
    async with serve_texts([HELLO]) as (server, _), httpx.AsyncClient(base_url=server.url) as http:
        headers = {"anthropic-version": "2023-06-01"}
        missing = await http.post(
            "/v1/messages", json={"model": MODEL, "messages": ASK}, headers=headers
        )
        broken = await http.post("/v1/messages", content=b"{not json", headers=headers)
        no_name = await http.post(
            "/v1/messages",
            headers=headers,
            json={
                "model": MODEL,
                "max_tokens": 4,
                "messages": ASK,
                "tools": [WEATHER],
                "tool_choice": {"type": "tool"},
            },
        )
        streamed_bad = await http.post(
            "/v1/messages",
            headers=headers,
            json={"model": MODEL, "max_tokens": 4, "messages": [], "stream": True},
        )
    for response in (missing, broken, no_name, streamed_bad):
        assert response.status_code == 400, response.text
        body = response.json()
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in missing.json()["error"]["message"]
    assert "name" in no_name.json()["error"]["message"]


async def test_a_client_that_leaves_a_stream_frees_the_engine(serve_texts: Any) -> None:
    async with serve_texts(["word " * 400], gated=True) as (server, runner):
        body = {"model": MODEL, "max_tokens": 1000, "messages": ASK, "stream": True}
        raw = await RawStream.post(server.url, "/v1/messages", body)
        runner.allow(3)
        await raw.read_until(lambda b: b"text_delta" in b)
        await raw.aclose()
        # The server sees the hang-up while the engine waits for its next step.
        await trio.testing.wait_all_tasks_blocked()
        runner.open()
        with trio.fail_after(10):
            await server.state.engine.wait_idle()
        assert engine_empty(server) and finished(server, "abort") == 1
    assert runner.written[0] < 1000  # it stopped long before its max_tokens


THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)
THOUGHT = "<think>\nThey want a greeting.\n</think>\n\n" + HELLO


async def test_thinking_blocks_whole_and_streamed(serve_texts: Any) -> None:
    reasoning = {"chat_template": THINKING_TEMPLATE, "reasoning_parser": "qwen3"}
    async with serve_texts([THOUGHT], **reasoning) as (server, _):
        client = sdk(server)
        whole = await in_thread(
            lambda: client.messages.create(
                model=MODEL,
                max_tokens=64,
                messages=ASK,
                thinking={"type": "enabled", "budget_tokens": 1024},
            )
        )

        def streamed() -> tuple[list[str], str, anthropic.types.Message]:
            with client.messages.stream(model=MODEL, max_tokens=64, messages=ASK) as stream:
                deltas, thinking = [], []
                for event in stream:
                    if event.type == "content_block_delta":
                        deltas.append(event.delta.type)
                    if event.type == "thinking":
                        thinking.append(event.thinking)
                return deltas, "".join(thinking), stream.get_final_message()

        deltas, thinking, final = await in_thread(streamed)
        off = await in_thread(
            lambda: client.messages.create(
                model=MODEL, max_tokens=64, messages=ASK, thinking={"type": "disabled"}
            )
        )
    first, text = whole.content
    assert isinstance(first, anthropic.types.ThinkingBlock)
    assert first.thinking == "They want a greeting." and first.signature == ""
    assert isinstance(text, anthropic.types.TextBlock) and text.text == HELLO
    assert thinking == "They want a greeting."
    assert (
        deltas.index("thinking_delta")
        < deltas.index("signature_delta")
        < deltas.index("text_delta")
    )
    assert [b.type for b in final.content] == ["thinking", "text"]
    # Thinking switched off: the template closes the block, the tags are only text.
    assert [b.type for b in off.content] == ["text"] and off.content[0].text == THOUGHT  # type: ignore[union-attr]


async def test_http_errors_on_these_paths_take_anthropics_shape(serve_texts: Any) -> None:
    async with (
        serve_texts([HELLO], max_body_bytes=2048) as (server, _),
        httpx.AsyncClient(base_url=server.url) as http,
    ):
        too_large = await http.post(
            "/v1/messages",
            json={
                "model": MODEL,
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "x" * 4096}],
            },
        )
        unknown = await http.post("/v1/messages/batches", json={})
        wrong_method = await http.get("/v1/messages")
    assert too_large.status_code == 413
    assert too_large.json()["error"]["type"] == "request_too_large"
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"
    assert wrong_method.status_code == 405
    assert wrong_method.json()["type"] == "error"


async def test_a_last_assistant_turn_is_continued(serve_texts: Any, tokenizer: Any) -> None:
    prefill = [*ASK, {"role": "assistant", "content": "Hello from"}]
    async with serve_texts([" the river."]) as (server, _):
        client = sdk(server)
        message = await in_thread(
            lambda: client.messages.create(model=MODEL, max_tokens=16, messages=prefill)
        )
        counted = await in_thread(
            lambda: client.messages.count_tokens(model=MODEL, messages=prefill)
        )
    open_ended = tokenizer.apply_chat_template(prefill, tokenize=False, continue_final_message=True)
    assert open_ended.endswith("Hello from")  # no end of turn, no new assistant turn
    expected = len(tokenizer.encode(open_ended, add_special_tokens=False))
    assert message.usage.input_tokens == counted.input_tokens == expected
    assert message.content[0].text == " the river."  # type: ignore[union-attr]
