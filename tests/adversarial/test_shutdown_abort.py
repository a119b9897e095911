"""The end of the drain, against a server subprocess: a stream still generating when
`--drain-grace` ends (or when a second signal cuts the drain short) is cut, and the
process exits 0, never aborting ("terminate called without an active exception",
exit 134: a model step abandoned at shutdown was still running torch while the
interpreter exited)."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest
import trio
from load_server import ServerProcess

from server_helpers import COMPLETIONS, StreamResult, completion, parse_event

# Long enough that no stream can finish inside the grace period.
_BODY = completion("Once upon a time, by a long river,", max_tokens=2000, n=4, stream=True)


async def _stream(client: httpx.AsyncClient, started: trio.Event, out: list[StreamResult]) -> None:
    async with client.stream("POST", COMPLETIONS, json=_BODY) as response:
        result = StreamResult(response.status_code)
        async for line in response.aiter_lines():
            parse_event(line, result)
            if any(c.get("text") for chunk in result.chunks for c in chunk["choices"]):
                started.set()
    out.append(result)


async def _cut_while_generating(server: ServerProcess, second_signal: bool) -> tuple[int, StreamResult]:
    """Start a long stream, SIGTERM once it is generating (then SIGINT at once if
    `second_signal`), read it to its end; returns (exit code, the stream)."""
    await trio.to_thread.run_sync(server.start)
    try:
        out: list[StreamResult] = []
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    started = trio.Event()
                    nursery.start_soon(_stream, client, started, out)
                    await started.wait()
                    server.signal(signal.SIGTERM)
                    if second_signal:
                        server.signal(signal.SIGINT)
        code = await trio.to_thread.run_sync(server.wait, 30)
    finally:
        server.stop()
    (result,) = out
    return code, result


def _check(code: int, result: StreamResult, log: str) -> None:
    assert "terminate called" not in log, log[-3000:]
    assert code == 0, log[-3000:]
    assert result.status == 200 and result.done, result


@pytest.mark.parametrize("second_signal", [False, True], ids=["grace-ends", "second-signal"])
async def test_cutting_a_generating_stream_exits_0(
    tokenizer_dir: Path, tmp_path: Path, second_signal: bool
) -> None:
    # The fake runner sleeps in the model thread; it may not reach torch at all, so
    # this holds the exit path, and the slow test below holds it with the model.
    flags = ["--step-delay", "0.01", "--drain-grace", "1"]
    server = ServerProcess.fake(tokenizer_dir, flags, tmp_path / "server.log", start_limit_s=60)
    code, result = await _cut_while_generating(server, second_signal)
    _check(code, result, server.log())


@pytest.mark.slow
@pytest.mark.parametrize("second_signal", [False, True], ids=["grace-ends", "second-signal"])
async def test_cutting_a_generating_stream_of_the_default_model_exits_0(
    tmp_path: Path, second_signal: bool
) -> None:
    # n=4 keeps every decode on the model thread, under the step watchdog.
    flags = ["--drain-grace", "1", "--served-model-name", "test-model"]
    server = ServerProcess.sluiceway(flags, tmp_path / "server.log", start_limit_s=180)
    code, result = await _cut_while_generating(server, second_signal)
    _check(code, result, server.log())
