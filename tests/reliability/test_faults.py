"""Fault injection against an in-process server with a fault-injecting fake runner.

For each fault: what the client sees, what /health says, and that the engine is
empty afterwards (0 running, 0 waiting, 0 KV blocks used).
"""

from __future__ import annotations

import random
from typing import Any

import httpx
import trio
from reliability_fakes import FaultRunner

from polling import eventually
from server_helpers import (
    CHAT,
    COMPLETIONS,
    RawStream,
    StreamResult,
    chat,
    completion,
    count_content,
    engine_empty,
    finished,
    finished_total,
    stream,
)
from sluiceway.config import EngineConfig


async def _health(client: httpx.AsyncClient) -> tuple[int, str]:
    r = await client.get("/health")
    return r.status_code, r.json()["status"]


async def _collect(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], out: list[Any]
) -> None:
    if body.get("stream"):
        out.append(await stream(client, path, body))
    else:
        r = await client.post(path, json=body)
        out.append((r.status_code, r.json()))




# ---- a step that raises -----------------------------------------------------------


def _in_engine(server: Any) -> int:
    stats = server.state.engine.stats()
    return stats.num_waiting_seqs + stats.num_running_seqs


async def _fail_mid_load(start_server: Any, runner: FaultRunner) -> tuple[Any, list[Any]]:
    runner.gated = True
    runner.fail_at_step = 1
    out: list[Any] = []
    async with (
        start_server() as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for i in range(3):
                    body = chat(f"s{i}", max_tokens=50, stream=True, n=1 + i % 2)
                    nursery.start_soon(_collect, client, CHAT, body, out)
                nursery.start_soon(
                    _collect, client, COMPLETIONS, completion("x", max_tokens=9), out
                )
                # Every request is inside the engine before the (failing) step runs.
                await eventually(lambda: _in_engine(server) >= 5)
                runner.release()
            health = await _health(client)
            late = await client.post(CHAT, json=chat("late", max_tokens=3))
            late_stream = await stream(client, CHAT, chat("late", max_tokens=3))
        return server, [out, health, late, late_stream]


async def test_step_that_raises(start_server: Any, runner: FaultRunner) -> None:
    server, (out, health, late, late_stream) = await _fail_mid_load(start_server, runner)
    streams = [r for r in out if isinstance(r, StreamResult)]
    plain = [r for r in out if not isinstance(r, StreamResult)]
    assert len(streams) == 3 and len(plain) == 1
    for s in streams:
        # Client sees: 200, then one error event, then [DONE]; nothing after it.
        assert s.status == 200 and s.done and s.after_done == 0
        assert [e["code"] for e in s.errors] == ["engine_unhealthy"]
        assert "injected step failure" in s.errors[0]["message"]
    status, body = plain[0]
    assert status == 503 and body["error"]["code"] == "engine_unhealthy"
    # /health turns 503 and stays there; new work is refused at once, never hangs.
    assert health == (503, "unhealthy")
    assert late.status_code == 503 and late.json()["error"]["code"] == "engine_unhealthy"
    assert late_stream.status == 503
    assert finished(server, "error") == 5  # every choice accounted for as an error


async def test_engine_empty_after_step_failure(start_server: Any, runner: FaultRunner) -> None:
    server, _ = await _fail_mid_load(start_server, runner)
    assert engine_empty(server), server.state.engine.stats()


async def test_engine_empty_after_watchdog(start_server: Any, runner: FaultRunner) -> None:
    runner.hang_at_step = 1
    async with (
        start_server(engine_config=EngineConfig(step_timeout=0.3)) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        with trio.fail_after(10):
            await stream(client, CHAT, chat("hi", max_tokens=20, n=2))
        assert engine_empty(server), server.state.engine.stats()


# ---- a step that hangs past a watchdog limit ----------------------------------------


async def test_hung_step_trips_watchdog(start_server: Any, runner: FaultRunner) -> None:
    runner.hang_at_step = 1
    config = EngineConfig(step_timeout=0.5)  # the watchdog API
    async with (
        start_server(engine_config=config) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        with trio.fail_after(10):
            result = await stream(client, CHAT, chat("hi", max_tokens=20, n=2))
            # Wanted: an error event naming the watchdog, [DONE], /health 503, new work 503.
            assert result.done and [e["code"] for e in result.errors] == ["engine_unhealthy"]
            assert await _health(client) == (503, "unhealthy")
            r = await client.post(CHAT, json=chat("late", max_tokens=3))
            assert r.status_code == 503


# ---- KV blocks exhausted under load ---------------------------------------------------


async def test_kv_exhaustion_preempts_without_loss(start_server: Any, runner: FaultRunner) -> None:
    # 8 blocks of 16 tokens: room for ~2 sequences of 50 tokens; 16 choices want in.
    runner.num_blocks = 8
    bodies = [completion(f"the river {i}", max_tokens=40, n=1 + i % 2) for i in range(10)]
    async with (
        start_server(engine_config=EngineConfig(max_waiting=64)) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        with trio.fail_after(30):
            alone = []
            for body in bodies[:4]:
                r = await client.post(COMPLETIONS, json=body)
                alone.append(r.json())
            out: list[Any] = []
            async with trio.open_nursery() as nursery:
                for i, body in enumerate(bodies):
                    nursery.start_soon(
                        _collect, client, COMPLETIONS, body | {"stream": i % 3 == 0}, out
                    )
            await server.state.engine.wait_idle()
        assert server.state.engine.stats().num_preemptions_total > 0
        assert engine_empty(server)
        assert await _health(client) == (200, "ok")
    assert len(out) == len(bodies)
    by_prompt: dict[str, dict[int, str]] = {}
    for result in out:
        if isinstance(result, StreamResult):
            assert result.done and not result.errors
            assert set(result.finish_reasons().values()) == {"length"}
            texts = result.texts()
            prompt = result.chunks[0]["id"]  # unused key; match by text below
            del prompt
            by_prompt.setdefault(texts[0], texts)
        else:
            status, body = result
            assert status == 200, body
            assert {c["finish_reason"] for c in body["choices"]} == {"length"}
            assert body["usage"]["completion_tokens"] == 40 * len(body["choices"])
    # Preemption and recompute change nothing: the same text as when run alone.
    for body in alone:
        assert body["choices"][0]["text"] in by_prompt or any(
            isinstance(r, tuple) and r[1]["choices"][0]["text"] == body["choices"][0]["text"]
            for r in out
        )


# ---- a storm of disconnects and timeouts -----------------------------------------------


async def _hang_up(url: str, rng: random.Random, i: int) -> None:
    body = chat(f"storm {i}", max_tokens=1500, n=1 + i % 3, stream=i % 4 != 0)
    data = RawStream.request_bytes(url, CHAT, body)
    raw = await RawStream.connect(url)
    how = i % 4
    try:
        if how == 0:  # half a body, then gone
            await raw.sock.send_all(data[: len(data) - 5])
        elif how == 1:  # whole request, gone before any answer
            await raw.sock.send_all(data)
        elif how == 2:  # gone after the headers / first bytes
            await raw.sock.send_all(data)
            await raw.read_until(lambda b: b"\r\n\r\n" in b)
        else:  # gone after k content chunks
            await raw.sock.send_all(data)
            k = rng.randint(1, 30)
            await raw.read_until(lambda b: count_content(b) >= k)
    finally:
        await raw.aclose()


async def test_disconnect_storm(start_server: Any, runner: FaultRunner) -> None:
    runner.step_delay = 0.001
    rng = random.Random(4)
    async with (
        start_server() as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        good: list[Any] = []
        with trio.fail_after(40):
            async with trio.open_nursery() as nursery:
                for i in range(40):
                    nursery.start_soon(_hang_up, server.url, rng, i)
                for i in range(6):
                    nursery.start_soon(
                        _collect, client, CHAT, chat(f"g{i}", max_tokens=20, n=2, stream=True), good
                    )
            await eventually(lambda: server.state.active == 0)
            await server.state.engine.wait_idle()
        for result in good:
            assert result.done and not result.errors
            assert result.finish_reasons() == {0: "length", 1: "length"}
        assert engine_empty(server)
        assert await _health(client) == (200, "ok")
        # Every admitted choice ended exactly once; nothing decodes on for a gone client.
        assert finished(server, "error") == 0 and finished(server, "timeout") == 0
        assert finished(server, "length") >= 12
        assert finished_total(server) == finished(server, "length") + finished(server, "abort")
        stats = server.state.engine.stats()
        assert stats.generation_tokens_total < 30 * 1500  # the hung-up ones stopped early


async def test_timeout_storm(start_server: Any, runner: FaultRunner) -> None:
    runner.gated = True  # the model makes no progress: every request hits its deadline
    async with (
        start_server(request_timeout=0.5) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        out: list[Any] = []
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for i in range(24):
                    body = chat(f"t{i}", max_tokens=30, n=1 + i % 3, stream=i % 2 == 0)
                    nursery.start_soon(_collect, client, CHAT, body, out)
            # /health stays ok: a timeout is the request's problem, not the engine's.
            assert await _health(client) == (200, "ok")
            runner.release()
            await server.state.engine.wait_idle()
            assert engine_empty(server)
            r = await client.post(CHAT, json=chat("after", max_tokens=5))
            assert r.status_code == 200
        for result in out:
            if isinstance(result, StreamResult):
                assert result.status == 200 and result.done and result.after_done == 0
                assert [e["code"] for e in result.errors] == ["request_timeout"]
            else:
                status, body = result
                assert status == 504 and body["error"]["code"] == "request_timeout"
        assert finished(server, "timeout") == sum(1 + i % 3 for i in range(24))


# ---- a client that never reads ----------------------------------------------------------


async def test_client_that_never_reads(start_server: Any, runner: FaultRunner) -> None:
    async with (
        start_server() as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        with trio.fail_after(30):
            # ~8,000 SSE events (MBs): far more than the socket buffers hold.
            sleeper = await RawStream.post(
                server.url, COMPLETIONS, completion("the", max_tokens=2000, n=4, stream=True)
            )
            sleeper2 = await RawStream.post(
                server.url, COMPLETIONS, completion("a", max_tokens=2000, n=4)
            )
            others: list[Any] = []
            async with trio.open_nursery() as nursery:
                for i in range(6):
                    nursery.start_soon(
                        _collect, client, CHAT, chat(f"o{i}", max_tokens=30, stream=True), others
                    )
            # The engine finished the sleeper's work too: its output waits in a buffer.
            await server.state.engine.wait_idle()
            assert engine_empty(server)
            assert await _health(client) == (200, "ok")
            await sleeper.aclose()
            await sleeper2.aclose()
            # The request's task ends once the socket is gone: no leaked slot.
            await eventually(lambda: server.state.active == 0)
        for result in others:
            assert result.done and not result.errors and result.finish_reasons() == {0: "length"}


# ---- a request body that never finishes arriving -------------------------------------------


async def test_body_that_never_finishes(start_server: Any, runner: FaultRunner) -> None:
    async with (
        start_server(body_timeout=0.5) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        with trio.fail_after(20):
            data = RawStream.request_bytes(server.url, CHAT, chat("slow", max_tokens=5))
            stuck = [await RawStream.connect(server.url) for _ in range(5)]
            for raw in stuck:
                await raw.sock.send_all(data[:-10])
            # Others are served meanwhile and /health is fine.
            r = await client.post(CHAT, json=chat("fine", max_tokens=5))
            assert r.status_code == 200
            assert await _health(client) == (200, "ok")
            # The stalled bodies time out with an error object, not a hang and not a 500.
            for raw in stuck:
                await raw.read_until(lambda b: b"\r\n\r\n" in b and b"}}" in b)
                assert raw.status() == 408, raw.buffer[:300]
                assert b'"error"' in raw.buffer
                await raw.aclose()
            assert engine_empty(server) and server.state.active == 0
