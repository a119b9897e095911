"""Streamed events written straight to the socket, over the real hypercorn stack: the
direct path is taken, and the bytes on the wire are a valid chunked HTTP/1.1
response with the same events the ASGI path sends, also when the socket takes
only part of a write."""

from __future__ import annotations

import socket
from typing import Any

import h11
import pytest
import trio
import trio.testing

from server_helpers import (
    CHAT,
    RawStream,
    StreamResult,
    chat,
    count_content,
    parse_event,
)
from sluiceway.transport.chunk_socket import ChunkSocket, frame

from .fakes import ScriptedRunner


class DirectWrites:
    """Counts `ChunkSocket.write_nowait` calls and the ones the kernel took only part of."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.partial = 0
        original = ChunkSocket.write_nowait

        def counted(chunk_socket: ChunkSocket, data: bytes) -> bytes | None:
            self.calls += 1
            rest = original(chunk_socket, data)
            self.partial += rest is not None
            return rest

        monkeypatch.setattr(ChunkSocket, "write_nowait", counted)


def parse_response(raw: bytes) -> tuple[int, bytes]:
    """Status and body of one HTTP/1.1 response, decoded strictly by h11."""
    client = h11.Connection(h11.CLIENT)
    client.send(
        h11.Request(method="POST", target=CHAT, headers=[("Host", "x"), ("Content-Length", "0")])
    )
    client.send(h11.EndOfMessage())
    client.receive_data(raw)
    status, body = 0, b""
    while True:
        event = client.next_event()
        if isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return status, body
        else:
            raise AssertionError(f"incomplete response: {event!r}")


def events(body: bytes) -> StreamResult:
    result = StreamResult(200)
    for line in body.decode().split("\n"):
        parse_event(line, result)
    return result


async def fetch(url: str, body: dict[str, Any], *, read_after: Any = None) -> bytes:
    """The whole raw response; with `read_after`, a small receive buffer and no
    reading past the response head until `await read_after()` returns."""
    raw = await RawStream.connect(url)
    if read_after is not None:
        raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await raw.sock.send_all(RawStream.request_bytes(url, CHAT, body))
    if read_after is not None:
        with trio.fail_after(20):
            await raw.read_until(lambda buf: b"\r\n\r\n" in buf)  # the request is admitted
        await read_after()
    with trio.fail_after(20):
        await raw.read_to_end()
    await raw.aclose()
    return raw.buffer


def test_frame_matches_h11s_chunk_writer():
    server = h11.Connection(h11.SERVER)
    server.receive_data(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    server.next_event()
    server.send(h11.Response(status_code=200, headers=[]))
    assert server.send(h11.Data(data=b"data: 1\n\n")) == frame(b"data: 1\n\n")


async def test_streamed_events_go_straight_to_the_socket(
    start_server: Any, runner: ScriptedRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = DirectWrites(monkeypatch)
    request = chat("direct", max_tokens=20, stream=True, stream_options={"include_usage": True})
    runner.gated = True
    async with start_server() as server:
        raw = await RawStream.post(server.url, CHAT, request)
        with trio.fail_after(20):
            await raw.read_until(lambda buf: b'"role":"assistant"' in buf)
            for k in range(1, 21):
                runner.allow(1)  # one step, one token, once the reader has the last one
                await raw.read_until(lambda buf, k=k: count_content(buf) >= k)
            await raw.read_to_end()
        await raw.aclose()
        runner.open()
        monkeypatch.setattr(ChunkSocket, "of", classmethod(lambda cls, send: None))
        through_asgi = await fetch(server.url, request)
    # Every token's event, the usage chunk and [DONE] found the body idle and nothing
    # queued (the role chunk may have come before the response head): all direct.
    assert writes.calls >= 22 and writes.partial == 0
    status, body = parse_response(raw.buffer)
    assert status == 200
    result = events(body)
    result.check_well_formed()
    expected = events(parse_response(through_asgi)[1])
    assert result.texts() == expected.texts() and result.texts()[0]
    usage, expected_usage = result.usage(), expected.usage()
    assert usage is not None and expected_usage is not None
    assert usage["completion_tokens"] == expected_usage["completion_tokens"] == 20
    assert result.finish_reasons() == {0: "length"}


async def test_a_reader_that_falls_behind_gets_every_event_in_order(
    start_server: Any, runner: ScriptedRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = DirectWrites(monkeypatch)
    original_of = ChunkSocket.of

    def small_send_buffer(cls: type[ChunkSocket], send: Any) -> ChunkSocket | None:
        stream = send.__self__.send.__self__.send.__self__.stream  # hypercorn's socket
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        return original_of(send)

    monkeypatch.setattr(ChunkSocket, "of", classmethod(small_send_buffer))
    # ~300 events of ~250 bytes: far more than both small socket buffers hold.
    request = chat("behind", max_tokens=300, stream=True)
    async with start_server() as server:

        async def generated() -> None:  # the engine is done; the events wait for the reader
            with trio.fail_after(20):
                await server.state.engine.wait_idle()
                await trio.testing.wait_all_tasks_blocked()  # writes stuck on the full socket

        behind = await fetch(server.url, request, read_after=generated)
        monkeypatch.setattr(ChunkSocket, "of", classmethod(lambda cls, send: None))
        expected = events(parse_response(await fetch(server.url, request))[1])
    assert writes.partial > 0  # the kernel took only part of some write
    status, body = parse_response(behind)
    assert status == 200
    result = events(body)
    result.check_well_formed()
    assert result.texts() == expected.texts()
    assert len(result.chunks) == len(expected.chunks)


async def test_an_http_1_0_reader_gets_an_unframed_stream(
    start_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No chunked framing in HTTP/1.0: the body ends when the connection closes, and
    the direct path, which writes chunks, stays out of the way."""
    writes = DirectWrites(monkeypatch)
    async with start_server() as server:
        raw = await RawStream.connect(server.url)
        request = RawStream.request_bytes(server.url, CHAT, chat("old", max_tokens=5, stream=True))
        await raw.sock.send_all(request.replace(b" HTTP/1.1\r\n", b" HTTP/1.0\r\n", 1))
        with trio.fail_after(20):
            await raw.read_to_end()  # until the server closes the connection
        await raw.aclose()
    assert writes.calls == 0
    head, _, body = raw.buffer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding" not in head.lower()
    assert all(line.startswith(b"data: ") for line in body.split(b"\n") if line)
    result = events(body)
    result.check_well_formed()
    assert result.finish_reasons() == {0: "length"}
