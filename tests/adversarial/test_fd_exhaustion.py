"""Idle keep-alive connections against a server process with few file descriptors:
they are reaped after the keep-alive timeout, whatever they served, so the server
answers again instead of going silent once its descriptors run out."""

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


async def _hold_idle_connection(url: str, held: list[trio.SocketStream]) -> None:
    host, port = url.removeprefix("http://").split(":")
    sock = await trio.open_tcp_stream(host, int(port))
    held.append(sock)
    # /v1/models goes through quart: the kind of response that used to leave its
    # connection open forever. Not read: whether it is served now or later, the
    # connection is idle once it has been.
    await sock.send_all(b"GET /v1/models HTTP/1.1\r\nHost: test\r\n\r\n")


async def test_idle_connections_beyond_the_fd_limit_do_not_silence_the_server(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    fake = ServerProcess.fake(tokenizer_dir, ["--keep-alive-timeout", "1"], tmp_path / "server.log")
    server = ServerProcess([sys.executable, "-c", SET_LIMIT_AND_EXEC, *fake.argv], fake.log_path, start_limit_s=60)
    await trio.to_thread.run_sync(server.start)
    held: list[trio.SocketStream] = []
    try:
        async with trio.open_nursery() as nursery:
            for _ in range(IDLE_CONNECTIONS):
                nursery.start_soon(_hold_idle_connection, server.url, held)
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            with trio.fail_after(30):  # keep-alive is 1 s: reaped well within this
                assert (await client.get("/health")).status_code == 200
                assert (await client.get("/v1/models")).status_code == 200
        assert server.open_fds() < FD_LIMIT
    finally:
        for sock in held:
            await sock.aclose()
        code = await trio.to_thread.run_sync(server.stop, 20)
    assert code == 0, server.log()[-3000:]
