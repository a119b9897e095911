"""Health, metrics, tokenizer endpoints, the OpenAPI document, signals."""

from __future__ import annotations

import json
import os
import signal
from functools import partial
from typing import Any

import httpx
import trio

from server_helpers import chat, stream
from sluiceway.api.serve import RunningServer, serve_async
from sluiceway.config import EngineConfig, ServerConfig
from sluiceway.engine.engine import Engine

from .conftest import MODEL
from .fakes import ScriptedRunner

METRICS = [
    "sluiceway_requests_running",
    "sluiceway_requests_waiting",
    "sluiceway_kv_cache_blocks_used",
    "sluiceway_kv_cache_blocks_total",
    "sluiceway_prompt_tokens_total",
    "sluiceway_generation_tokens_total",
    "sluiceway_preemptions_total",
    'sluiceway_requests_finished_total{reason="stop"}',
    'sluiceway_requests_finished_total{reason="length"}',
    'sluiceway_requests_finished_total{reason="abort"}',
    'sluiceway_requests_finished_total{reason="timeout"}',
    'sluiceway_requests_finished_total{reason="error"}',
    "sluiceway_time_to_first_token_seconds_bucket",
    "sluiceway_inter_token_latency_seconds_bucket",
    "sluiceway_e2e_request_latency_seconds_bucket",
]


def _sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise KeyError(name)


async def test_metrics(client: httpx.AsyncClient) -> None:
    r = await client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    for name in METRICS:
        assert name in r.text, name
    assert _sample(r.text, "sluiceway_kv_cache_blocks_total") == 512
    await stream(client, "/v1/chat/completions", chat("hi", max_tokens=4, n=2))
    text = (await client.get("/metrics")).text
    assert _sample(text, 'sluiceway_requests_finished_total{reason="length"}') == 2
    assert _sample(text, "sluiceway_generation_tokens_total") == 8
    assert _sample(text, "sluiceway_time_to_first_token_seconds_count") == 2
    assert _sample(text, "sluiceway_inter_token_latency_seconds_count") == 6
    assert _sample(text, "sluiceway_e2e_request_latency_seconds_count") == 1
    assert _sample(text, "sluiceway_requests_running") == 0


async def test_tokenize_roundtrip(client: httpx.AsyncClient) -> None:
    r = await client.post("/tokenize", json={"model": MODEL, "prompt": "Hello world"})
    body = r.json()
    assert body["count"] == len(body["tokens"]) > 0 and body["max_model_len"] == 2048
    r = await client.post("/detokenize", json={"tokens": body["tokens"]})
    assert r.json()["prompt"] == "Hello world"
    r = await client.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]})
    chat_tokens = r.json()["tokens"]
    done = await client.post("/v1/chat/completions", json=chat("hi", max_tokens=1))
    assert done.json()["usage"]["prompt_tokens"] == len(chat_tokens)


async def test_openapi_document(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.")
    for path in (
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/health",
        "/metrics",
        "/tokenize",
        "/detokenize",
        "/openapi.json",
    ):
        assert path in doc["paths"], path


async def test_sigterm_drains_and_stops(runner: ScriptedRunner, tokenizer: Any) -> None:
    """A real SIGTERM to this process: the server drains, stops listening and returns."""
    engine = Engine(
        runner, tokenizer, EngineConfig(), eos_token_ids={tokenizer.eos_token_id}, max_model_len=256
    )
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            server: RunningServer = await nursery.start(
                partial(
                    serve_async,
                    engine,
                    server_config=ServerConfig(port=0),
                    model_name=MODEL,
                    handle_signals=True,
                )
            )
            async with httpx.AsyncClient(base_url=server.url) as client:
                assert (await client.get("/health")).status_code == 200
            os.kill(os.getpid(), signal.SIGTERM)
        # serve_async returned by itself: nothing cancelled this nursery
    assert server.state.draining and not engine.healthy


async def test_plain_health_check_is_answered_before_quart(server: RunningServer) -> None:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        raise AssertionError("quart would read the request; the fast path does not")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "path": "/health", "method": "GET", "headers": [(b"host", b"x")]}
    await server.app(scope, receive, send)
    assert sent[0]["status"] == 200
    assert (b"content-type", b"application/json") in sent[0]["headers"]
    assert json.loads(sent[1]["body"]) == {"status": "ok"} and not sent[1]["more_body"]
