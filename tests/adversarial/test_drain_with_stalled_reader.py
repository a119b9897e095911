"""SIGTERM while a client holds a stream it does not read: the drain ends at
`--drain-grace` whatever the client does, and the process exits 0."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import trio
from load_server import ServerProcess, metrics

from polling import eventually
from server_helpers import CHAT, chat

GRACE_S = 1.0


async def _stalled_stream(url: str) -> trio.SocketStream:
    """A long stream whose client reads nothing, through a tiny receive window."""
    host, port = url.removeprefix("http://").split(":")
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect((host, int(port)))
    stream = trio.SocketStream(sock)
    body = json.dumps(chat("never read", max_tokens=1900, n=8, stream=True, logprobs=True, top_logprobs=5))
    head = f"POST {CHAT} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    await stream.send_all(head.encode() + body.encode())
    return stream


async def test_sigterm_ends_at_the_grace_even_with_a_client_that_never_reads(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    # A stall bound far beyond the test: only the drain's end may cut the client.
    flags = ["--step-delay", "0.002", "--drain-grace", str(GRACE_S), "--send-stall-timeout", "600"]
    server = ServerProcess.fake(tokenizer_dir, flags, tmp_path / "server.log", start_limit_s=60)
    await trio.to_thread.run_sync(server.start)
    stream = await _stalled_stream(server.url)
    try:
        # Generating: its tokens outrun a client that takes none of them.
        await eventually(
            lambda: metrics(server.url).get("sluiceway_requests_running", 0) >= 1, on_thread=True
        )
        server.signal()
        try:
            # Grace, then half a second for cut requests, then the process ends; the
            # margin is for a loaded machine. Before the fix it never exited.
            code = await trio.to_thread.run_sync(server.wait, GRACE_S + 10)
        except subprocess.TimeoutExpired:
            raise AssertionError("still running well after the drain grace:\n" + server.log()[-3000:]) from None
        assert code == 0, server.log()[-3000:]
        assert "Traceback" not in server.log(), server.log()[-3000:]
    finally:
        await stream.aclose()
        server.stop(5)
