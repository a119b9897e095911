"""Two sluiceway replicas (scripted runner, real HTTP/engine/KV stack, as subprocesses)
behind `vllm-router` on loopback: a mixed load all succeeds, kv_aware routing finds a
replica's cached prefix, and a replica killed mid-load costs only its own open streams.

Skipped where the `vllm-router` binary is not installed. Everything waits by polling
with bounded deadlines; nothing sleeps to let things happen."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from load_server import ServerProcess
from router_process import LOOPBACK_KV_EVENTS, RouterProcess, router_binary

from polling import eventually

pytestmark = pytest.mark.skipif(router_binary() is None, reason="vllm-router is not installed")

MODEL = "test-model"
LONG = "the river flows under a quiet bridge and on " * 8


@pytest.fixture
def replicas(tokenizer_dir: Path, tmp_path: Path) -> Iterator[list[ServerProcess]]:
    # Model steps take a few milliseconds, so streams are still open when one dies.
    flags = ["--step-delay", "0.004", "--kv-events-config", LOOPBACK_KV_EVENTS]
    pair = [
        ServerProcess.fake(tokenizer_dir, flags, tmp_path / f"replica{i}.log") for i in range(2)
    ]
    try:
        # Both start at once: each takes seconds to import and load its tokenizer.
        with ThreadPoolExecutor(2) as pool:
            for started in [pool.submit(r.start) for r in pair]:
                started.result()
        yield pair
    finally:
        for replica in pair:
            if replica.proc is not None:
                replica.stop(grace_s=5)


def _router(replicas: list[ServerProcess], policy: str, tmp_path: Path) -> RouterProcess:
    return RouterProcess([r.url for r in replicas], policy, tmp_path / "router.log").start()


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _stream(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> str:
    """'ok' (200, every choice finished, [DONE] last), 'error' (an error status or
    event) or 'cut' (the response ended early)."""
    finished: dict[int, str] = {}
    done = errored = False
    try:
        async with client.stream("POST", path, json=body | {"stream": True}) as r:
            if r.status_code != 200:
                await r.aread()
                return "error"
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line.removeprefix("data: ")
                if data == "[DONE]":
                    done = True
                    continue
                chunk = json.loads(data)
                errored |= "error" in chunk
                for choice in chunk.get("choices", []):
                    if choice.get("finish_reason"):
                        finished[choice["index"]] = choice["finish_reason"]
    except (httpx.RemoteProtocolError, httpx.ReadError):
        return "cut"
    if errored:
        return "error"
    return "ok" if done and len(finished) == body.get("n", 1) else "cut"


async def _complete(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await client.post(path, json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    assert all(c["finish_reason"] in ("stop", "length") for c in out["choices"]), out
    return out


def _chat(content: str, **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}]} | kw


def _completion(prompt: Any, **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt} | kw


async def test_mixed_load_through_kv_aware_router(
    replicas: list[ServerProcess], tmp_path: Path
) -> None:
    router = _router(replicas, "kv_aware", tmp_path)
    try:
        async with httpx.AsyncClient(base_url=router.url, timeout=30) as client:
            outcomes: list[str] = []
            bodies: list[dict[str, Any]] = []

            async def one_stream(path: str, body: dict[str, Any]) -> None:
                outcomes.append(await _stream(client, path, body))

            async def one_call(path: str, body: dict[str, Any]) -> None:
                bodies.append(await _complete(client, path, body))

            async with trio.open_nursery() as nursery:
                for i in range(4):
                    nursery.start_soon(
                        one_stream, "/v1/chat/completions", _chat(f"story {i}", max_tokens=24)
                    )
                    nursery.start_soon(
                        one_call, "/v1/chat/completions", _chat(f"note {i}", max_tokens=8)
                    )
                for i in range(3):
                    body = _completion(f"once {i}", max_tokens=12, n=2)
                    nursery.start_soon(one_stream, "/v1/completions", body)
                    nursery.start_soon(
                        one_call, "/v1/completions", _completion(["a b", "c d"], max_tokens=4)
                    )
            assert outcomes == ["ok"] * 7
            assert len(bodies) == 7

            # The client's request id reaches the replica and comes back.
            r = await client.post(
                "/v1/completions",
                json=_completion("hi", max_tokens=2),
                headers={"X-Request-Id": "fleet-req-7"},
            )
            assert r.status_code == 200 and r.headers["x-request-id"] == "fleet-req-7"

            # A conversation's next turn goes where its prefix is cached.
            first = await _complete(client, "/v1/chat/completions", _chat(LONG, max_tokens=4))
            again = await _complete(client, "/v1/chat/completions", _chat(LONG, max_tokens=4))
            cached = first["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
            assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= cached + 64
    finally:
        router.stop()
    # The router asked a replica to tokenize (render) rather than guessing.
    assert "kv_index subscriber" in router.log()


async def test_a_replica_killed_mid_load(replicas: list[ServerProcess], tmp_path: Path) -> None:
    router = _router(replicas, "round_robin", tmp_path)
    victim, survivor = replicas
    running = f'vllm:num_requests_running{{model_name="{MODEL}"}}'
    try:
        async with httpx.AsyncClient(base_url=router.url, timeout=30) as client:
            outcomes: list[str] = []

            async def one_stream(i: int) -> None:
                outcomes.append(
                    await _stream(
                        client, "/v1/chat/completions", _chat(f"long {i}", max_tokens=400)
                    )
                )

            with trio.fail_after(60):  # no stream may hang
                async with trio.open_nursery() as nursery:
                    for i in range(8):
                        nursery.start_soon(one_stream, i)
                    await eventually(
                        lambda: all(_metric(r.url, running) > 0 for r in replicas),
                        15.0,
                        interval=0.02,
                        on_thread=True,
                    )
                    victim.signal(signal.SIGKILL)
                    victim.wait(10)
                    # Requests that start now and are sent to the dead replica are retried
                    # on the live one.
                    for i in range(6):
                        await _complete(
                            client, "/v1/completions", _completion(f"after {i}", max_tokens=3)
                        )
            assert len(outcomes) == 8
            assert outcomes.count("ok") >= 1, outcomes  # the survivor's streams finish
            assert outcomes.count("ok") < 8, outcomes  # the victim's end early, without hanging

            # The router marks it unhealthy and stops sending to it: no more retries.
            await eventually(
                lambda: router.healthy_workers() == 1, 15.0, interval=0.02, on_thread=True
            )
            served = _metric(
                survivor.url, f'vllm:e2e_request_latency_seconds_count{{model_name="{MODEL}"}}'
            )
            retries = router.counter("vllm_router_retries_total")
            for i in range(4):
                await _complete(client, "/v1/completions", _completion(f"later {i}", max_tokens=3))
            assert router.counter("vllm_router_retries_total") == retries
            after = _metric(
                survivor.url, f'vllm:e2e_request_latency_seconds_count{{model_name="{MODEL}"}}'
            )
            assert after == served + 4
    finally:
        router.stop()
