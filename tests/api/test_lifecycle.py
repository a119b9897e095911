"""Disconnects, stalled readers, timeouts, a full queue, draining and engine failure."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from polling import eventually
from server_helpers import RawStream, StreamResult, chat, count_content, stream
from sluiceway.api.serve import RunningServer
from sluiceway.config import EngineConfig

from .conftest import MODEL
from .fakes import ScriptedRunner

C = "/v1/chat/completions"


def _finished(server: RunningServer, reason: str) -> float:
    value = server.state.metrics.registry.get_sample_value(
        "sluiceway_requests_finished_total", {"reason": reason}
    )
    return value or 0.0


def _idle(server: RunningServer) -> bool:
    stats = server.state.engine.stats()
    return stats.num_running_seqs == 0 and stats.num_waiting_seqs == 0 and stats.kv_blocks_used == 0


async def _read_all(
    client: httpx.AsyncClient, body: dict[str, Any], out: dict[str, StreamResult], key: str
) -> None:
    out[key] = await stream(client, C, body)


async def test_disconnect_aborts_and_frees(start_server: Any, runner: ScriptedRunner) -> None:
    runner.gated = True
    async with (
        start_server() as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        assert _idle(server)
        results: dict[str, StreamResult] = {}
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for key in ("b", "c"):
                    nursery.start_soon(_read_all, client, chat(key, max_tokens=20), results, key)
                # "a" wants 1500 tokens (n=2), reads two content chunks, then hangs up.
                a = await RawStream.post(
                    server.url, C, chat("a", max_tokens=1500, n=2, stream=True)
                )
                runner.allow(3)
                await a.read_until(lambda buf: count_content(buf) >= 2)
                await a.aclose()
                # The server sees the hang-up and aborts both of a's choices...
                await eventually(lambda: _finished(server, "abort") == 2)
                runner.open()  # ...and the engine drops them at its next step.
        for key in ("b", "c"):
            results[key].check_well_formed()
            assert results[key].finish_reasons() == {0: "length"}
        with trio.fail_after(10):
            await server.state.engine.wait_idle()
        assert _idle(server)
        # a's sequences stopped within a step or two of the hang-up: no zombie decoding.
        assert server.state.engine.stats().generation_tokens_total < 40 + 2 * 10
        assert _finished(server, "length") == 2


@pytest.mark.parametrize("steps_on_event_loop", [False, True])
async def test_stalled_reader_does_not_block_others(
    start_server: Any, steps_on_event_loop: bool
) -> None:
    config = EngineConfig(steps_on_event_loop=steps_on_event_loop)
    async with (
        start_server(engine_config=config) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        with trio.fail_after(20):
            stalled = await RawStream.post(
                server.url, C, chat("slow reader", max_tokens=300, stream=True)
            )
            results: dict[str, StreamResult] = {}
            async with trio.open_nursery() as nursery:
                for key in ("b", "c", "d"):
                    nursery.start_soon(_read_all, client, chat(key, max_tokens=50), results, key)
            for key in ("b", "c", "d"):
                results[key].check_well_formed()
            # The engine finished the stalled stream's work too; its output waits in a buffer.
            await server.state.engine.wait_idle()
            assert _idle(server)
            await stalled.read_to_end()
            await stalled.aclose()
            late = stalled.events()
        late.check_well_formed()
        assert late.finish_reasons() == {0: "length"}


async def test_request_timeout(start_server: Any, runner: ScriptedRunner) -> None:
    runner.gated = True  # the model never answers
    async with (
        start_server(request_timeout=0.5) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        with trio.fail_after(20):
            result = await stream(client, C, chat("hi", max_tokens=10, n=2))
            assert result.done and [e["code"] for e in result.errors] == ["request_timeout"]
            assert result.errors[0]["type"] == "timeout_error"
            r = await client.post(C, json=chat("hi", max_tokens=10))
            assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout"
            assert _finished(server, "timeout") == 3
            runner.open()
            await server.state.engine.wait_idle()
            assert _idle(server)
            # a request that fits in the deadline is unaffected
            r = await client.post(C, json=chat("hi", max_tokens=3))
            assert r.status_code == 200


async def test_queue_full_429(start_server: Any, runner: ScriptedRunner) -> None:
    """With one slot and room for two to wait, a fourth request is refused, whether
    or not the engine has scheduled the first yet (it holds an idle engine's first
    step while a burst may still be arriving)."""
    runner.gated = True
    config = EngineConfig(max_num_seqs=1, max_waiting=2)
    async with (
        start_server(engine_config=config) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        results: dict[str, StreamResult] = {}
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for key in ("a", "b", "c"):
                    nursery.start_soon(_read_all, client, chat(key, max_tokens=3), results, key)
                    await eventually(lambda k=key: _admitted(server) == "abc".index(k) + 1)
                r = await client.post(C, json=chat("one too many", max_tokens=3))
                assert r.status_code == 429
                assert r.headers["retry-after"] == "1"
                assert r.json()["error"]["type"] == "rate_limit_error"
                r = await client.post("/v1/completions", json={"prompt": "x", "stream": True})
                assert r.status_code == 429
                runner.open()
        assert all(results[k].finish_reasons() == {0: "length"} for k in "abc")


def _admitted(server: RunningServer) -> int:
    stats = server.state.engine.stats()
    return stats.num_running_seqs + stats.num_waiting_seqs


async def test_drain_lets_open_streams_finish(start_server: Any, runner: ScriptedRunner) -> None:
    runner.gated = True
    async with start_server() as server:
        results: dict[str, StreamResult] = {}
        with trio.fail_after(20):
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(
                        _read_all, client, chat("open", max_tokens=5), results, "open"
                    )
                    await eventually(lambda: _admitted(server) == 1)
                    server.shutdown()
                    await eventually(lambda: server.state.draining)
                    async with httpx.AsyncClient(base_url=server.url, timeout=30) as other:
                        r = await other.get("/health")
                        assert r.status_code == 503 and r.json()["status"] == "draining"
                        r = await other.post(C, json=chat("new", max_tokens=5))
                        assert r.status_code == 503 and r.json()["error"]["code"] == "draining"
                    runner.open()
            results["open"].check_well_formed()
            assert results["open"].finish_reasons() == {0: "length"} and not results["open"].errors
            # then the server stops listening by itself
            await eventually(lambda: server.state.active == 0)
            await _wait_closed(server)


async def _wait_closed(server: RunningServer) -> None:
    async def refused() -> bool:
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=5) as probe:
                await probe.get("/health")
        except httpx.ConnectError:
            return True
        return False

    await eventually(refused, interval=0.01)


async def test_drain_grace_cuts_streams_cleanly(start_server: Any, runner: ScriptedRunner) -> None:
    runner.gated = True  # the open requests would never finish on their own
    async with start_server(drain_grace_seconds=0.3) as server:
        results: dict[str, Any] = {}
        with trio.fail_after(20):
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:

                async def non_streaming() -> None:
                    results["plain"] = await client.post(C, json=chat("plain", max_tokens=5))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(
                        _read_all, client, chat("open", max_tokens=5), results, "open"
                    )
                    nursery.start_soon(non_streaming)
                    await eventually(lambda: _admitted(server) == 2)
                    server.shutdown()
            cut = results["open"]
            assert cut.done and [e["code"] for e in cut.errors] == ["draining"]
            assert results["plain"].status_code == 503
            await _wait_closed(server)


async def test_engine_failure_errors_in_stream_and_unhealthy(
    start_server: Any, runner: ScriptedRunner
) -> None:
    runner.gated = True
    async with (
        start_server() as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        results: dict[str, StreamResult] = {}
        plain: list[httpx.Response] = []

        async def non_streaming() -> None:
            plain.append(await client.post(C, json=chat("plain", max_tokens=50)))

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for key in ("a", "b"):
                    nursery.start_soon(
                        _read_all, client, chat(key, max_tokens=50, n=2), results, key
                    )
                nursery.start_soon(non_streaming)
                await eventually(lambda: _admitted(server) == 5)
                runner.fail_next = True
                runner.open()
        for key in ("a", "b"):
            assert results[key].done
            assert [e["code"] for e in results[key].errors] == ["engine_unhealthy"]
        assert plain[0].status_code == 503
        r = await client.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "unhealthy"
        # A browser's check (Origin: quart's route, not the fast path) says the same.
        from_browser = await client.get("/health", headers={"Origin": "https://app.example"})
        assert (from_browser.status_code, from_browser.json()) == (503, r.json())
        r = await client.post(C, json=chat("after", max_tokens=5, stream=True))
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unhealthy"
        assert (await client.get("/metrics")).status_code == 200
        assert (await client.get("/v1/models")).status_code == 200
        assert MODEL
