"""SIGTERM under load, against a server subprocess: streams that fit in the grace
period finish whole; the one that does not ends with a clean `draining` error event
and [DONE] (never cut mid-event); new work gets 503; the process exits 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import trio
from load_server import ServerProcess

from polling import eventually
from server_helpers import CHAT, StreamResult, chat, parse_event


def _answers_503(client: httpx.AsyncClient):
    async def draining() -> bool:
        return (await client.get("/health")).status_code == 503

    return draining

async def _stream(
    client: httpx.AsyncClient, body: dict[str, Any], started: trio.Event, out: list[StreamResult]
) -> None:
    async with client.stream("POST", CHAT, json=body | {"stream": True}) as response:
        result = StreamResult(response.status_code)
        async for line in response.aiter_lines():
            parse_event(line, result)
            if result.chunks and any(
                c["delta"].get("content") for ch in result.chunks for c in ch["choices"]
            ):
                started.set()
    out.append(result)


async def test_sigterm_drains_under_load(tokenizer_dir: Path, tmp_path: Path) -> None:
    flags = ["--step-delay", "0.005", "--drain-grace", "4"]
    server = ServerProcess.fake(tokenizer_dir, flags, tmp_path / "server.log", start_limit_s=60)
    await trio.to_thread.run_sync(server.start)
    try:
        short: list[StreamResult] = []
        long: list[StreamResult] = []
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            with trio.fail_after(40):
                async with trio.open_nursery() as nursery:
                    events = []
                    for i in range(6):
                        ev = trio.Event()
                        events.append(ev)
                        body = chat(
                            f"short {i}", max_tokens=150, stream_options={"include_usage": True}
                        )
                        nursery.start_soon(_stream, client, body, ev, short)
                    ev = trio.Event()
                    events.append(ev)
                    nursery.start_soon(_stream, client, chat("long", max_tokens=1800), ev, long)
                    for ev in events:
                        await ev.wait()
                    server.signal()  # SIGTERM with every stream mid-flight
                    await eventually(_answers_503(client))
                    health = (await client.get("/health")).json()
                    late = await client.post(CHAT, json=chat("late", max_tokens=3))
                code = await trio.to_thread.run_sync(server.wait, 20)
    finally:
        server.stop()
    assert health["status"] == "draining"
    assert late.status_code == 503 and late.json()["error"]["code"] == "draining"
    assert len(short) == 6
    for result in short:
        assert result.status == 200 and result.done and result.after_done == 0, result.errors
        assert not result.errors
        assert result.finish_reasons() == {0: "length"}
        usage = result.usage()
        assert usage is not None and usage["completion_tokens"] == 150
    (cut,) = long
    assert cut.done and cut.after_done == 0
    assert [e["code"] for e in cut.errors] == ["draining"]
    assert code == 0, server.log()[-3000:]
