"""A small fake OpenAI-style HTTP/1.1 server on a real 127.0.0.1 socket.

Each test sets ``server.handler = async def handler(request, conn)`` and scripts
the response with ``conn``: JSON replies, or SSE written piece by piece (so an
event can really be split across network reads). Every response carries
``Connection: close``; the server records each request with its arrival time
(``trio.current_time()``, so MockClock tests can check backoff) and notices when
the client goes away.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from sluiceway.client import AsyncClient


@attrs.define
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    time: float

    def json(self) -> Any:
        return json.loads(self.body)


class Conn:
    """One accepted connection, answering one request."""

    def __init__(self, stream: trio.SocketStream, server: FakeServer) -> None:
        self.stream = stream
        self.server = server
        self.chunked = True

    async def send_head(self, status: int, headers: dict[str, str]) -> None:
        lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in headers.items()]
        lines.append("Connection: close")
        await self.stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode())

    async def send_json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(obj).encode()
        await self.send_head(
            status,
            {
                "Content-Type": "application/json",
                "Content-Length": str(len(body)),
                **(headers or {}),
            },
        )
        await self.stream.send_all(body)

    async def send_error(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        error = {"message": message, "type": type_, "param": param, "code": code}
        await self.send_json(status, {"error": error}, headers)

    async def start_sse(self, *, chunked: bool = True) -> None:
        """Send SSE headers: chunked framing, or a body that ends when we close."""
        self.chunked = chunked
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        if chunked:
            headers["Transfer-Encoding"] = "chunked"
        await self.send_head(200, headers)

    async def send_raw(self, data: bytes | str) -> None:
        """Body bytes as they go on the wire (one HTTP chunk when chunked)."""
        if isinstance(data, str):
            data = data.encode()
        if self.chunked:
            data = b"%x\r\n%s\r\n" % (len(data), data)
        await self.stream.send_all(data)

    async def send_event(self, obj: Any) -> None:
        await self.send_raw(f"data: {json.dumps(obj)}\n\n")

    async def send_done(self, *, end: bool = True) -> None:
        await self.send_raw("data: [DONE]\n\n")
        if end:
            await self.end()

    async def end(self) -> None:
        """End the body cleanly (the terminating chunk when chunked)."""
        if self.chunked:
            await self.stream.send_all(b"0\r\n\r\n")

    async def wait_disconnect(self) -> None:
        """Return once the client has closed the connection."""
        try:
            while await self.stream.receive_some():
                pass
        except trio.BrokenResourceError:
            pass
        self.server.disconnected.set()


Handler = Callable[[Request, Conn], Awaitable[None]]


class FakeServer:
    def __init__(self) -> None:
        self.handler: Handler | None = None
        self.requests: list[Request] = []
        self.port = 0
        self.disconnected = trio.Event()
        self.in_flight = 0
        self.max_in_flight = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **kwargs: Any) -> AsyncClient:
        return AsyncClient(self.url, **kwargs)

    async def serve_connection(self, stream: trio.SocketStream) -> None:
        try:
            request = await self._read_request(stream)
            if request is None:
                return
            self.requests.append(request)
            assert self.handler is not None, "the test set no handler"
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                await self.handler(request, Conn(stream, self))
            finally:
                self.in_flight -= 1
        except trio.BrokenResourceError:
            self.disconnected.set()
        finally:
            await stream.aclose()

    async def _read_request(self, stream: trio.SocketStream) -> Request | None:
        data = b""
        while b"\r\n\r\n" not in data:
            more = await stream.receive_some()
            if not more:
                return None
            data += more
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            more = await stream.receive_some()
            if not more:
                return None
            body += more
        return Request(method, path, headers, body, trio.current_time())


# ------------------------------------------------------------------ payloads


def chat_chunk(
    index: int, content: str | None = None, finish: str | None = None, role: str | None = None
) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def completion_chunk(index: int, text: str, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish}],
    }


def chat_completion(text: str = "hello", index: int = 0) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": index,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


def completion(text: str = "hello") -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
