"""The load generator's HTTP: one kept-alive HTTP/1.1 connection per worker, h11 over
trio streams, and the `data:` payloads of a server-sent event stream.

The load generator runs on the machine it measures. Through httpx and httpx-sse it
spent 98-99 us of CPU per streamed token at 32 streams and 251-258 at one stream
(fake model, real HTTP stack); through this path `sluiceway bench serve` spends
55-67 and 195-202 (process CPU time over the same load). On a 2-core machine every
such microsecond is taken from the server: 110 us more per token cost 8% of the
server's throughput at 32 streams (8 alternating pairs). The streamed requests and
the health probe (a GET every 50 ms while the load runs) come here; the one-off
model listing still uses httpx.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from urllib.parse import urlsplit

import attrs
import h11
import trio

_READ_SIZE = 65536


class LoadHTTPError(Exception):
    """The connection failed or the server broke the HTTP protocol."""


@attrs.frozen
class Origin:
    """Where the requests go: scheme, host, port, path prefix and the headers each
    carries."""

    scheme: str
    host: str
    port: int
    path_prefix: str = ""  # the URL's own path, put before each request's path
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_url(cls, url: str, headers: dict[str, str] | None = None) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        prefix = parts.path.rstrip("/")
        return cls(parts.scheme, parts.hostname, port, prefix, tuple((headers or {}).items()))

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


@attrs.frozen
class StreamedResponse:
    """A response whose body is read as it arrives."""

    status_code: int
    body: AsyncGenerator[bytes, None]


class Connection:
    """One worker's connection: requests go one after another and the connection is
    kept between them; it is opened on first use and again after the server closed
    it. Not for concurrent use."""

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self._stream: trio.abc.Stream | None = None
        self._h11 = h11.Connection(h11.CLIENT)

    async def _open(self) -> trio.abc.Stream:
        if self.origin.scheme == "https":
            return await trio.open_ssl_over_tcp_stream(
                self.origin.host, self.origin.port, ssl_context=ssl.create_default_context()
            )
        return await trio.open_tcp_stream(self.origin.host, self.origin.port)

    def post(self, path: str, body: bytes) -> AbstractAsyncContextManager[StreamedResponse]:
        """POST `body` (JSON) to `path`; see `request`."""
        return self.request("POST", path, body)

    @asynccontextmanager
    async def request(
        self, method: str, path: str, body: bytes | None = None
    ) -> AsyncIterator[StreamedResponse]:
        """Send one request (`body`, if any, as JSON); yields the response with its body
        unread. Raises LoadHTTPError when the connection fails. Leaving the block
        before the body's end (or by an exception, or cancellation) closes the
        connection, so the next request opens a fresh one."""
        if self._h11.our_state is h11.MUST_CLOSE or self._h11.their_state is h11.MUST_CLOSE:
            await self.aclose()
        if self._stream is None:
            try:
                self._stream = await self._open()
            except OSError as exc:
                raise LoadHTTPError(f"connect failed: {exc}") from exc
            self._h11 = h11.Connection(h11.CLIENT)
        headers = [("Host", self.origin.host_header), *self.origin.headers]
        if body is not None:
            headers += [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        target = self.origin.path_prefix + path
        request = h11.Request(method=method, target=target, headers=headers)
        finished = False
        try:
            out = self._h11.send(request) or b""
            if body is not None:
                out += self._h11.send(h11.Data(data=body)) or b""
            await self._send(out + (self._h11.send(h11.EndOfMessage()) or b""))
            response = await self._next_event()
            if not isinstance(response, h11.Response):
                raise LoadHTTPError(f"expected a response, got {type(response).__name__}")

            async def read_body() -> AsyncGenerator[bytes, None]:
                nonlocal finished
                while True:
                    event = await self._next_event()
                    if isinstance(event, h11.Data):
                        yield bytes(event.data)
                    elif isinstance(event, h11.EndOfMessage):
                        finished = True
                        return

            yield StreamedResponse(response.status_code, read_body())
        finally:
            if finished and self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
                self._h11.start_next_cycle()
            else:
                await self.aclose()

    async def _send(self, data: bytes) -> None:
        assert self._stream is not None
        try:
            await self._stream.send_all(data)
        except (OSError, trio.BrokenResourceError) as exc:
            raise LoadHTTPError(f"send failed: {exc}") from exc

    async def _next_event(self) -> h11.Event:
        assert self._stream is not None
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as exc:
                raise LoadHTTPError(f"bad HTTP from the server: {exc}") from exc
            if event is not h11.NEED_DATA:
                if isinstance(event, h11.ConnectionClosed):
                    raise LoadHTTPError("the server closed the connection mid-response")
                return event  # type: ignore[return-value]
            try:
                data = await self._stream.receive_some(_READ_SIZE)
            except (OSError, trio.BrokenResourceError) as exc:
                raise LoadHTTPError(f"receive failed: {exc}") from exc
            self._h11.receive_data(bytes(data))  # b"" is the end of the stream

    async def aclose(self) -> None:
        """Close the socket (the next request reconnects); idempotent."""
        stream, self._stream = self._stream, None
        if stream is not None:
            with trio.CancelScope(shield=True):
                await stream.aclose()


async def sse_data(body: AsyncIterator[bytes]) -> AsyncGenerator[str, None]:
    """The `data` of each server-sent event in `body`, in order (the lines of a
    multi-line `data` joined with newlines); comments, other fields and events
    without data are skipped, and so is an event the stream ends in the middle of
    (as the SSE standard has it). Lines end in LF or CRLF."""
    pending = b""
    data: list[str] = []
    async for chunk in body:
        pending += chunk
        # A CR at the end may be the first half of a CRLF split across chunks.
        held = b"\r" if pending.endswith(b"\r") else b""
        lines = pending[: len(pending) - len(held)].replace(b"\r\n", b"\n").split(b"\n")
        pending = lines.pop() + held  # an unfinished line waits for the next chunk
        for line in lines:
            if not line:  # a blank line dispatches the event
                if data:
                    yield "\n".join(data)
                    data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                data.append((value[1:] if value.startswith(b" ") else value).decode())
