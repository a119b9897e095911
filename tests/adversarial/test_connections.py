"""Byte-level attacks on a connection, against an in-process server over loopback:
a reply sent before the request body has arrived, idle keep-alive connections,
and clients that stop reading. Every wait is bounded by `fail_after`, so a
connection the server leaves hanging fails the test instead of hanging it."""

from __future__ import annotations

import gc
import json
import socket
from contextlib import suppress
from typing import Any

import h11
import trio

from polling import eventually
from server_helpers import CHAT, chat, engine_empty

KEY = "secret"
LIMIT_S = 10


class RawConnection:
    """One keep-alive HTTP/1.1 connection driven byte by byte. h11, as the client,
    frames what is sent and parses what comes back, so the server's bytes are
    judged by a real parser; the test decides when each piece goes out."""

    def __init__(self, sock: trio.SocketStream) -> None:
        self.sock = sock
        self.parser = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, url: str, *, receive_buffer: int | None = None) -> RawConnection:
        host, port = url.removeprefix("http://").split(":")
        sock = trio.socket.socket()
        if receive_buffer is not None:  # before connect, so the window stays small
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        await sock.connect((host, int(port)))
        return cls(trio.SocketStream(sock))

    async def send_head(
        self, method: str, path: str, *, length: int | None = None, key: str | None = KEY
    ) -> None:
        """The request line and headers alone: Content-Length `length`, or chunked."""
        headers = [("Host", "test"), ("Content-Type", "application/json")]
        headers.append(("Content-Length", str(length)) if length is not None else ("Transfer-Encoding", "chunked"))
        if key is not None:
            headers.append(("Authorization", f"Bearer {key}"))
        await self.sock.send_all(self.parser.send(h11.Request(method=method, target=path, headers=headers)))

    async def send_body(self, data: bytes, *, end: bool = True) -> None:
        out = self.parser.send(h11.Data(data=data)) or b""
        if end:
            out += self.parser.send(h11.EndOfMessage()) or b""
        await self.sock.send_all(out)

    async def response(self) -> tuple[int, bytes]:
        """The next whole response: status and body."""
        status, body = 0, b""
        while True:
            event = self.parser.next_event()
            if event is h11.NEED_DATA:
                self.parser.receive_data(await self.sock.receive_some(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return status, body
            else:
                raise AssertionError(f"unexpected {event!r}")

    async def request(
        self, method: str, path: str, body: bytes = b"", *, key: str | None = KEY
    ) -> int:
        """A whole request and its response on this connection; the status."""
        if self.parser.our_state is h11.DONE and self.parser.their_state is h11.DONE:
            self.parser.start_next_cycle()
        await self.send_head(method, path, length=len(body), key=key)
        await self.send_body(body)
        status, _ = await self.response()
        return status

    async def closed_by_server(self) -> bool:
        """Read to the server's end of the connection: True at EOF or reset."""
        try:
            while await self.sock.receive_some(65536):
                pass
        except trio.BrokenResourceError:
            pass  # reset
        return True

    async def aclose(self) -> None:
        await self.sock.aclose()

    async def __aenter__(self) -> RawConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _early_reply_cases() -> list[tuple[str, str, dict[str, Any], int]]:
    body = chat("hello", max_tokens=2)
    return [
        ("POST", CHAT, body, 401),  # no key: refused before the body is read
        ("POST", "/v1/no-such-endpoint", body, 404),
        ("PUT", CHAT, body, 405),
    ]


async def _early_reply_then(
    url: str, method: str, path: str, body: dict[str, Any], status: int
) -> RawConnection:
    """Send a request's head alone, take the early reply, then send its body."""
    conn = await RawConnection.open(url)
    data = json.dumps(body).encode()
    await conn.send_head(method, path, length=len(data), key=None if status == 401 else KEY)
    got, _ = await conn.response()
    assert got == status
    await conn.send_body(data)  # a later TCP segment, as the openai client writes it
    return conn


async def test_early_reply_before_the_body_leaves_the_connection_usable(start_server: Any) -> None:
    async with start_server(api_keys=(KEY,)) as server:
        for method, path, body, status in _early_reply_cases():
            with trio.fail_after(LIMIT_S):
                async with await _early_reply_then(server.url, method, path, body, status) as conn:
                    assert await conn.request("GET", "/v1/models") == 200


async def test_early_reply_then_client_leaves_mid_body_closes_the_server_side(
    start_server: Any,
) -> None:
    async with start_server(api_keys=(KEY,)) as server, await RawConnection.open(server.url) as conn:
        await conn.send_head("POST", CHAT, length=10_000, key=None)
        with trio.fail_after(LIMIT_S):
            await conn.response()
            await conn.send_body(b"{" * 100, end=False)
            await conn.sock.send_eof()  # gone without the rest of the body
            assert await conn.closed_by_server()


async def test_early_reply_body_that_never_comes_is_closed_after_body_timeout(
    start_server: Any,
) -> None:
    async with (
        start_server(api_keys=(KEY,), body_timeout=0.2) as server,
        await RawConnection.open(server.url) as conn,
    ):
        await conn.send_head("POST", CHAT, length=10_000, key=None)
        with trio.fail_after(LIMIT_S):
            await conn.response()
            await conn.send_body(b"{" * 100, end=False)
            assert await conn.closed_by_server()


async def test_early_reply_body_over_the_size_limit_is_closed(start_server: Any) -> None:
    async with (
        start_server(api_keys=(KEY,), max_body_bytes=1_000) as server,
        await RawConnection.open(server.url) as conn,
    ):
        # Chunked, so no Content-Length check can refuse it up front.
        await conn.send_head("POST", CHAT, key=None)
        with trio.fail_after(LIMIT_S):
            status, _ = await conn.response()
            assert status == 401
            with suppress(trio.BrokenResourceError):  # closed while it still sends
                for _ in range(10):
                    await conn.send_body(b"x" * 512, end=False)
            assert await conn.closed_by_server()


async def test_idle_keep_alive_connections_are_closed_whatever_they_served(
    start_server: Any,
) -> None:
    stream_body = json.dumps(chat("hi", max_tokens=3, stream=True)).encode()
    async with start_server(keep_alive_timeout=1.0) as server:
        for method, path, body in [
            ("GET", "/v1/models", b""),
            ("GET", "/metrics", b""),
            ("POST", CHAT, json.dumps(chat("hi", max_tokens=3)).encode()),
            ("POST", CHAT, stream_body),
            ("GET", "/health", b""),
        ]:
            async with await RawConnection.open(server.url) as conn:
                with trio.fail_after(LIMIT_S):
                    assert await conn.request(method, path, body, key=None) == 200
                    assert await conn.closed_by_server()


async def test_a_client_that_stops_reading_is_cut_off_and_its_request_freed(
    start_server: Any,
) -> None:
    body = json.dumps(
        chat("flood", max_tokens=1500, n=4, stream=True, logprobs=True, top_logprobs=5)
    ).encode()
    async with start_server(send_stall_timeout=0.3) as server:
        async with await RawConnection.open(server.url, receive_buffer=4096) as conn:
            await conn.send_head("POST", CHAT, length=len(body), key=None)
            await conn.send_body(body)
            # Read nothing: the server's writes fill both socket buffers and stall.
            with trio.fail_after(LIMIT_S):
                await eventually(lambda: server.state.engine.stats().num_running_seqs > 0)
                await eventually(lambda: engine_empty(server) and server.state.active == 0)
                assert await conn.closed_by_server()
        # The others never noticed: the server still answers.
        async with await RawConnection.open(server.url) as other:
            with trio.fail_after(LIMIT_S):
                next_body = json.dumps(chat("next", max_tokens=3)).encode()
                assert await other.request("POST", CHAT, next_body, key=None) == 200


async def test_a_cancelled_server_closes_its_open_connections(start_server: Any) -> None:
    async with start_server() as server:
        conn = await RawConnection.open(server.url)
        with trio.fail_after(LIMIT_S):
            assert await conn.request("GET", "/v1/models", key=None) == 200  # kept, idle
    # The server was cancelled with the connection open: its side is closed, not
    # left for the garbage collector (which would warn of an unclosed socket).
    gc.collect()
    async with conn:
        with trio.fail_after(LIMIT_S):
            assert await conn.closed_by_server()
