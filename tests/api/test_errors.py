"""Bad input gets an OpenAI error object with the right status, never a 500."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from server_helpers import chat

from .conftest import MODEL

C, X = "/v1/chat/completions", "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]
INVALID = "invalid_request_error"
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


# (path, body, status, error type, param: the JSON path of the offending value)
TABLE: list[tuple[str, Any, int, str, str | None]] = [
    (C, {"model": MODEL}, 400, INVALID, "messages"),
    (C, {"messages": []}, 400, INVALID, "messages"),
    (C, {"messages": "hi"}, 400, INVALID, "messages"),
    (C, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, INVALID, "messages[0].role"),
    (C, {"messages": [{"role": "user"}]}, 400, INVALID, "messages[0].content"),
    (C, {"messages": [{"role": "user", "content": 5}]}, 400, INVALID, "messages[0].content"),
    (
        C,
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        400,
        INVALID,
        "messages[0].content[0].type",
    ),
    (C, {"messages": [MSG, "not a conversation"]}, 400, INVALID, "messages[1]"),
    (C, {"messages": [MSG, []]}, 400, INVALID, "messages[1]"),
    (C, {"messages": [MSG[0], MSG]}, 400, INVALID, "messages[1]"),
    (C, {"messages": MSG, "max_tokens": -1}, 400, INVALID, "max_tokens"),
    (C, {"messages": MSG, "max_tokens": 0}, 400, INVALID, "max_tokens"),
    (C, {"messages": MSG, "max_tokens": "ten"}, 400, INVALID, "max_tokens"),
    (C, {"messages": MSG, "max_tokens": 2.5}, 400, INVALID, "max_tokens"),
    (C, {"messages": MSG, "max_completion_tokens": 0}, 400, INVALID, "max_completion_tokens"),
    (C, {"messages": MSG, "n": 0}, 400, INVALID, "n"),
    (C, {"messages": MSG, "n": True}, 400, INVALID, "n"),
    (C, {"messages": MSG, "n": 10_000}, 400, INVALID, "n"),
    (C, {"messages": MSG, "temperature": -0.1}, 400, INVALID, "temperature"),
    (C, {"messages": MSG, "temperature": "hot"}, 400, INVALID, "temperature"),
    (C, {"messages": MSG, "top_p": 0}, 400, INVALID, "top_p"),
    (C, {"messages": MSG, "top_p": 1.5}, 400, INVALID, "top_p"),
    (C, {"messages": MSG, "top_k": -2}, 400, INVALID, "top_k"),
    (C, {"messages": MSG, "min_p": 2}, 400, INVALID, "min_p"),
    (C, {"messages": MSG, "presence_penalty": 3}, 400, INVALID, "presence_penalty"),
    (C, {"messages": MSG, "frequency_penalty": -3}, 400, INVALID, "frequency_penalty"),
    (C, {"messages": MSG, "repetition_penalty": 0}, 400, INVALID, "repetition_penalty"),
    (C, {"messages": MSG, "min_tokens": 5, "max_tokens": 2}, 400, INVALID, "min_tokens"),
    (C, {"messages": MSG, "seed": "abc"}, 400, INVALID, "seed"),
    (C, {"messages": MSG, "stop": 5}, 400, INVALID, "stop"),
    (C, {"messages": MSG, "stop": [""]}, 400, INVALID, "stop[0]"),
    (C, {"messages": MSG, "stop_token_ids": [-1]}, 400, INVALID, "stop_token_ids[0]"),
    (C, {"messages": MSG, "stop_token_ids": [10**9]}, 400, INVALID, "stop_token_ids"),
    (C, {"messages": MSG, "logit_bias": {"abc": 1}}, 400, INVALID, "logit_bias"),
    (C, {"messages": MSG, "logit_bias": {"10": 500}}, 400, INVALID, "logit_bias"),
    (C, {"messages": MSG, "logprobs": 3}, 400, INVALID, "logprobs"),
    (C, {"messages": MSG, "top_logprobs": 3}, 400, INVALID, "top_logprobs"),
    (C, {"messages": MSG, "logprobs": True, "top_logprobs": 50}, 400, INVALID, "top_logprobs"),
    (C, {"messages": MSG, "stream": "yes"}, 400, INVALID, "stream"),
    (
        C,
        {"messages": MSG, "stream_options": {"include_usage": True}},
        400,
        INVALID,
        "stream_options",
    ),
    (
        C,
        {"messages": MSG, "stream": True, "stream_options": {"include_usage": 1}},
        400,
        INVALID,
        "stream_options.include_usage",
    ),
    (C, {"messages": MSG, "tools": [{"type": "function"}]}, 400, INVALID, "tools[0].function"),
    (C, {"messages": MSG, "tools": [TOOL, TOOL]}, 400, INVALID, "tools[1].function.name"),
    (
        C,
        {"messages": MSG, "tools": [{"type": "function", "function": {"name": "a b"}}]},
        400,
        INVALID,
        "tools[0].function.name",
    ),
    (C, {"messages": MSG, "tools": [TOOL], "tool_choice": "sometimes"}, 400, INVALID, "tool_choice"),
    (
        C,
        {"messages": MSG, "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        400,
        INVALID,
        "tool_choice.function.name",
    ),
    (C, {"messages": MSG, "tool_choice": "required"}, 400, INVALID, "tool_choice"),
    (
        C,
        {"messages": MSG, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "frobnicate"}}}]},
        400,
        INVALID,
        "tools",
    ),
    (C, {"messages": MSG, "response_format": {"type": "xml"}}, 400, INVALID, "response_format.type"),
    (
        C,
        {"messages": MSG, "response_format": {"type": "json_schema"}},
        400,
        INVALID,
        "response_format.json_schema",
    ),
    (
        C,
        {"messages": MSG, "response_format": schema_format({"type": "string", "pattern": "(?<=a)b"})},
        400,
        INVALID,
        "response_format.json_schema.schema",
    ),
    (
        C,
        {"messages": MSG, "response_format": schema_format({"type": "string", "format": "telepathy"})},
        400,
        INVALID,
        "response_format.json_schema.schema",
    ),
    (
        C,
        {"messages": MSG, "structured_outputs": {"regex": "a+", "choice": ["a"]}},
        400,
        INVALID,
        "structured_outputs",
    ),
    (C, {"messages": MSG, "structured_outputs": {"regex": "[a-"}}, 400, INVALID, "structured_outputs.regex"),
    (C, {"messages": MSG, "structured_outputs": {"choice": []}}, 400, INVALID, "structured_outputs.choice"),
    (
        C,
        {"messages": MSG, "structured_outputs": {"grammar": "start: undefined_rule"}},
        400,
        INVALID,
        "structured_outputs.grammar",
    ),
    (
        C,
        {"messages": MSG, "structured_outputs": {"json": "{not json"}},
        400,
        INVALID,
        "structured_outputs.json",
    ),
    (
        C,
        {"messages": MSG, "response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
        400,
        INVALID,
        "structured_outputs",
    ),
    (C, {"messages": MSG, "max_tokens": 5000}, 400, INVALID, "max_tokens"),
    (C, {"messages": [{"role": "user", "content": "word " * 3000}]}, 400, INVALID, "messages"),
    (C, {"messages": MSG, "model": "gpt-17"}, 404, INVALID, "model"),
    (C, [1, 2, 3], 400, INVALID, None),
    (X, {}, 400, INVALID, "prompt"),
    (X, {"prompt": []}, 400, INVALID, "prompt"),
    (X, {"prompt": 5}, 400, INVALID, "prompt"),
    (X, {"prompt": [[1, 2], []]}, 400, INVALID, "prompt[1]"),
    (X, {"prompt": [1, "a", [2]]}, 400, INVALID, "prompt"),
    (X, {"prompt": [[10**9]]}, 400, INVALID, "prompt"),
    (X, {"prompt": "hi", "logprobs": 30}, 400, INVALID, "logprobs"),
    (X, {"prompt": "hi", "echo": True, "logprobs": 1}, 400, INVALID, "echo"),
    (X, {"prompt": "hi", "max_tokens": -5}, 400, INVALID, "max_tokens"),
    (X, {"prompt": "", "max_tokens": 5}, 400, INVALID, "prompt"),
    (X, {"prompt": "hi", "model": "nope"}, 404, INVALID, "model"),
    (X, {"prompt": "hi", "suffix": "end"}, 400, INVALID, "suffix"),
    (X, {"prompt": "hi", "best_of": 3}, 400, INVALID, "best_of"),
    (X, {"prompt": "hi", "structured_outputs": {"regex": "(?=a)"}}, 400, INVALID, "structured_outputs.regex"),
    ("/tokenize", {"tokens": 1}, 400, INVALID, "prompt"),
    ("/detokenize", {"tokens": ["a"]}, 400, INVALID, "tokens[0]"),
    ("/detokenize", {"tokens": [-4]}, 400, INVALID, "tokens[0]"),
]


async def test_malformed_requests_table(client: httpx.AsyncClient) -> None:
    failures = []
    for i, (path, body, status, kind, param) in enumerate(TABLE):
        r = await client.post(path, json=body)
        error = (
            r.json().get("error")
            if r.headers["content-type"].startswith("application/json")
            else None
        )
        got = (r.status_code, error and error["type"], error and error["param"])
        if got != (status, kind, param) or set(error or {}) != {"message", "type", "param", "code"}:
            failures.append(
                (i, path, body if len(str(body)) < 200 else "<long>", got, r.text[:200])
            )
    assert not failures, "\n".join(map(str, failures))
    # the server is still fine afterwards
    r = await client.post(C, json=chat("still ok", max_tokens=2))
    assert r.status_code == 200


@pytest.mark.parametrize(
    "raw", [b"{not json", b"", b"\xff\xfe", b'{"messages": [}', b"[" * 100_000]
)
async def test_invalid_json(client: httpx.AsyncClient, raw: bytes) -> None:
    r = await client.post(C, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == INVALID


async def test_unknown_fields_ignored(client: httpx.AsyncClient) -> None:
    body = chat(
        "hi", max_tokens=2, user="u1", frobnicate={"x": 1}, metadata={"a": "b"}, best_of=None
    )
    r = await client.post(C, json=body)
    assert r.status_code == 200, r.text


async def test_unknown_route_and_method(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = await client.get(C)
    assert r.status_code == 405 and "error" in r.json()
    r = await client.get("/v1/models/other")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


async def test_oversized_body_413_closes(start_server: Any) -> None:
    async with (
        start_server(max_body_bytes=10_000) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        r = await client.post(C, json=chat("x" * 20_000))
        assert r.status_code == 413
        assert r.headers["connection"] == "close"
        assert r.json()["error"]["code"] == "request_too_large"
        r = await client.post(C, json=chat("small", max_tokens=2))
        assert r.status_code == 200


async def test_api_keys(start_server: Any) -> None:
    async with (
        start_server(api_keys=("k1", "k2")) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        for headers in (
            {},
            {"Authorization": "Bearer nope"},
            {"Authorization": "k1"},
            {"Authorization": "Basic k1"},
        ):
            r = await client.post(C, json=chat("hi", max_tokens=2), headers=headers)
            assert r.status_code == 401, headers
            assert r.json()["error"]["type"] == "authentication_error"
        r = await client.get("/v1/models")
        assert r.status_code == 401
        for key in ("k1", "k2"):
            r = await client.post(
                C, json=chat("hi", max_tokens=2), headers={"Authorization": f"Bearer {key}"}
            )
            assert r.status_code == 200
        for open_path in ("/health", "/metrics", "/openapi.json"):
            assert (await client.get(open_path)).status_code == 200


async def test_cors(start_server: Any) -> None:
    async with (
        start_server(allowed_origins=("https://app.example",)) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        r = await client.options(
            C, headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
        )
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        r = await client.get("/v1/models", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in r.headers
        # /health answers plain checks before quart; a browser's still gets CORS headers.
        plain = await client.get("/health")
        r = await client.get("/health", headers={"Origin": "https://app.example"})
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        assert "access-control-allow-origin" not in plain.headers
        assert (r.status_code, r.json()) == (plain.status_code, plain.json()) == (200, {"status": "ok"})
