"""Many connections against a server process with few file descriptors: those
beyond what the limit leaves room for are refused with a 503 at once, and idle
keep-alive connections are reaped after the keep-alive timeout whatever they
served, so the server never goes silent with its descriptors used up."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import trio
from load_server import ServerProcess

IDLE_CONNECTIONS = 120
FD_LIMIT = 96  # below the idle connections plus the fake server's own descriptors
SET_LIMIT_AND_EXEC = (
    "import os, resource, sys;"
    f"resource.setrlimit(resource.RLIMIT_NOFILE, ({FD_LIMIT}, {FD_LIMIT}));"
    "os.execv(sys.argv[1], sys.argv[1:])"
)


async def _hold_idle_connection(url: str, held: list[trio.SocketStream], statuses: list[bytes]) -> None:
    host, port = url.removeprefix("http://").split(":")
    sock = await trio.open_tcp_stream(host, int(port))
    held.append(sock)
    # /v1/models goes through quart: the kind of response that used to leave its
    # connection open forever.
    await sock.send_all(b"GET /v1/models HTTP/1.1\r\nHost: test\r\n\r\n")
    with trio.fail_after(10):  # served or refused, never left waiting
        reply = await sock.receive_some(65536)
        assert b"x-request-id: " in reply.lower(), reply
        statuses.append(reply[:12])


async def test_connections_beyond_the_fd_limit_are_refused_and_idle_ones_reaped(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    fake = ServerProcess.fake(tokenizer_dir, ["--keep-alive-timeout", "1"], tmp_path / "server.log")
    server = ServerProcess([sys.executable, "-c", SET_LIMIT_AND_EXEC, *fake.argv], fake.log_path, start_limit_s=60)
    await trio.to_thread.run_sync(server.start)
    held: list[trio.SocketStream] = []
    statuses: list[bytes] = []
    try:
        async with trio.open_nursery() as nursery:
            for _ in range(IDLE_CONNECTIONS):
                nursery.start_soon(_hold_idle_connection, server.url, held, statuses)
        assert set(statuses) == {b"HTTP/1.1 200", b"HTTP/1.1 503"}, set(statuses)
        # The refused ones are closed; the served ones go idle and are reaped after
        # the keep-alive timeout, so the server answers again.
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
            with trio.fail_after(30):
                while (await client.get("/health")).status_code != 200:  # noqa: ASYNC110
                    await trio.sleep(0.1)  # across a process boundary: poll
                assert (await client.get("/v1/models")).status_code == 200
        assert server.open_fds() < FD_LIMIT
        assert "EMFILE" not in server.log()
    finally:
        for sock in held:
            await sock.aclose()
        code = await trio.to_thread.run_sync(server.stop, 20)
    assert code == 0, server.log()[-3000:]
