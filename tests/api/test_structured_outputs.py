"""Structured outputs and tool calls through the HTTP API, over a runner that samples
fixed logits with the real sampler (so the grammar masks are what make the output
valid): JSON schemas with n > 1, every tool_choice, streamed tool calls, and a
disconnect that frees the matchers and KV blocks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import jsonschema
import pytest
import trio

from grammar_runner import MaskFollowingRunner
from polling import eventually
from server_helpers import RawStream, chat, completion, stream
from sluiceway.api.serve import RunningServer

C, X = "/v1/chat/completions", "/v1/completions"
RECORD = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "days", "unit"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather in a city", "parameters": RECORD},
}
NOW = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture
async def grammar_server(
    tokenizer: Any, serve_runner: Callable[..., Any]
) -> AsyncIterator[RunningServer]:
    async with serve_runner(MaskFollowingRunner(tokenizer)) as s:
        yield s


@pytest.fixture
async def client(grammar_server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=grammar_server.url, timeout=60) as c:
        yield c


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "record", "schema": schema, "strict": True}}


async def test_json_schema_with_n4_gives_four_valid_outputs(client: httpx.AsyncClient) -> None:
    r = await client.post(
        C, json=chat("weather?", n=4, seed=5, max_tokens=200, response_format=schema_format(RECORD))
    )
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    for c in choices:
        assert c["finish_reason"] == "stop"
        jsonschema.validate(json.loads(c["message"]["content"]), RECORD)


async def test_json_object_and_vllm_fields_on_both_endpoints(client: httpx.AsyncClient) -> None:
    # Seeded: an unseeded random walk can stay inside one string until max_tokens cuts it.
    body = chat("x", max_tokens=300, seed=3, response_format={"type": "json_object"})
    choice = (await client.post(C, json=body)).json()["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    assert isinstance(json.loads(choice["message"]["content"]), dict)
    r = await client.post(
        X, json=completion("x", max_tokens=50, structured_outputs={"choice": ["left", "right"]})
    )
    assert r.json()["choices"][0]["text"] in ("left", "right")
    r = await client.post(
        X, json=completion("x", max_tokens=50, structured_outputs={"regex": "[0-9]{4}"})
    )
    assert len(r.json()["choices"][0]["text"]) == 4
    r = await client.post(
        C, json=chat("x", max_tokens=50, structured_outputs={"grammar": 'root ::= "ja" | "nein"'})
    )
    assert r.json()["choices"][0]["message"]["content"] in ("ja", "nein")


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
async def test_required_and_named_tool_choice_return_valid_calls(
    client: httpx.AsyncClient, tool_choice: Any
) -> None:
    body = chat("weather in Rome?", tools=[WEATHER, NOW], tool_choice=tool_choice, max_tokens=200, seed=2)
    r = await client.post(C, json=body)
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    calls = choice["message"]["tool_calls"]
    assert calls and choice["message"]["content"] is None
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        if call["function"]["name"] == "get_weather":
            jsonschema.validate(json.loads(call["function"]["arguments"]), RECORD)
        else:
            assert call["function"]["name"] == "now" and tool_choice == "required"


async def test_streamed_tool_calls_reassemble_into_the_full_answer(client: httpx.AsyncClient) -> None:
    body = chat("weather?", tools=[WEATHER], tool_choice="required", max_tokens=200, seed=9)
    whole = (await client.post(C, json=body)).json()["choices"][0]["message"]["tool_calls"]
    result = await stream(client, C, body)
    assert result.done and not result.errors
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for choice in result.by_index()[0]:
        for piece in choice["delta"].get("tool_calls") or []:
            if "id" in piece:  # the first piece of a call: id, type and name
                assert piece["type"] == "function" and piece["function"]["name"]
                calls[piece["index"]] = {"name": piece["function"]["name"], "arguments": ""}
            calls[piece["index"]]["arguments"] += piece.get("function", {}).get("arguments", "")
        finish = choice["finish_reason"] or finish
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (w["function"]["name"], w["function"]["arguments"]) for w in whole
    ]


async def test_auto_and_none_leave_text_free(client: httpx.AsyncClient) -> None:
    for tool_choice in ("auto", "none"):
        body = chat("hello", tools=[WEATHER], tool_choice=tool_choice, max_tokens=8, seed=1)
        r = await client.post(C, json=body)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] in ("stop", "length", "tool_calls")


async def test_a_conversation_continues_after_a_tool_call(client: httpx.AsyncClient) -> None:
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "-3 and snow"},
    ]
    r = await client.post(C, json={"messages": messages, "tools": [WEATHER], "max_tokens": 5})
    assert r.status_code == 200, r.text


async def test_disconnect_mid_way_frees_matchers_and_blocks(grammar_server: RunningServer) -> None:
    engine = grammar_server.state.engine
    body = chat("records", n=4, seed=4, max_tokens=2000, response_format=schema_format({"type": "array", "items": RECORD}))
    raw = await RawStream.post(grammar_server.url, C, body | {"stream": True})
    await raw.read_until(lambda data: b"data: " in data)
    await eventually(lambda: engine.stats().num_constrained_seqs == 4)
    await raw.sock.aclose()  # the client hangs up mid-way
    with trio.fail_after(30):
        await engine.wait_idle()
    stats = engine.stats()
    assert stats.num_constrained_seqs == 0 and stats.num_running_seqs == 0
    assert stats.kv_blocks_used == 0
