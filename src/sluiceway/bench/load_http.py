"""The load generator's HTTP: one kept-alive HTTP/1.1 connection per worker, read with a
blocking socket on a worker thread and parsed by httptools (llhttp); the server-sent
events of a streamed body are split after the response has ended.

The load generator runs on the machine it measures, so its CPU per streamed token is
taken from the server. On trio streams most of that was trio's own wake-up per
arriving token, then h11, the SSE split and JSON per event. Here each read is fed to
llhttp (many times cheaper per event than h11) and noted with its time and the
body's length so far, and the events are split, matched to the read that completed
them and parsed once the response is complete. What the client costs and what the
server gained from it: `docs/benchmarks.md`.

Timings are what the client saw: an event's time is when the read that completed it
returned, which is when a streaming parser would have yielded it.
"""

from __future__ import annotations

import bisect
import functools
import select
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import attrs
import httptools
import trio

_READ_SIZE = 65536
CONNECT_TIMEOUT = 30.0
CLOSE_WAIT = 1.0  # an exchange's thread ends within its next read once stopped


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
class Response:
    """A whole response and when its bytes came (`time.perf_counter`). `started` is
    when the exchange began (before connecting, when it had to), `finished` when the
    response's last byte was read; `arrivals` holds, for each read that brought body
    bytes, its time and the body's length after it (both ascending)."""

    status_code: int
    body: bytes
    started: float
    finished: float
    arrivals: tuple[tuple[float, int], ...]

    def arrival(self, end: int) -> float:
        """When the body's first `end` bytes had all arrived (`end` >= 1)."""
        i = bisect.bisect_left(self.arrivals, end, key=lambda a: a[1])
        return self.arrivals[min(i, len(self.arrivals) - 1)][0]


class _Reader:
    """httptools' callbacks for one response."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.keep_alive = False
        self.status_code = 0
        self.parts: list[bytes] = []
        self.size = 0
        self.headers_done = False
        self.complete = False
        self.delimited = False  # by a Content-Length or chunked encoding, not by the close

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self.delimited = True

    def on_headers_complete(self) -> None:
        self.headers_done = True
        self.status_code = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)
        self.size += len(body)

    def on_message_complete(self) -> None:
        self.complete = True
        # Only now: once `feed_data` returns, llhttp has reset for the next message.
        self.keep_alive = self.parser.should_keep_alive()


class _Abort:
    """Stops one exchange from another thread: shuts its socket down, so a blocked
    read returns at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.requested = False

    def watch(self, sock: socket.socket) -> None:
        """The exchange reads `sock` from now on; raises if it was already stopped."""
        with self._lock:
            self._sock = sock
            if self.requested:
                raise LoadHTTPError("the request was cancelled")

    def __call__(self) -> None:
        with self._lock:
            self.requested = True
            sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed or never connected


class Connection:
    """One worker's connection: requests go one after another and the connection is
    kept between them; it is opened on first use and again after the server closed
    it. Each exchange runs on a thread of its own (`request`), one at a time."""

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        # Touched only by whoever holds `_one_at_a_time`: the exchange's thread, or aclose.
        self._sock: socket.socket | None = None
        self._one_at_a_time = trio.CapacityLimiter(1)
        self._abort: _Abort | None = None

    async def request(self, method: str, path: str, body: bytes | None = None) -> Response:
        """Send one request (`body`, if any, as JSON) and read its whole response on a
        worker thread. Raises LoadHTTPError when the connection fails or the server
        breaks HTTP. On cancellation returns at once and shuts the socket down, so
        the thread ends at its next read; the next request waits for that thread and
        then opens a fresh connection."""
        abort = self._abort = _Abort()
        exchange = functools.partial(self._exchange, method, path, body, abort)
        try:
            return await trio.to_thread.run_sync(
                exchange, abandon_on_cancel=True, limiter=self._one_at_a_time
            )
        except BaseException:
            abort()  # a no-op after a failed exchange, which closed its socket already
            raise

    async def aclose(self) -> None:
        """Close the connection (the next request reconnects); idempotent. An exchange
        still running on its thread is stopped and waited for, shielded from
        cancellation, for at most `CLOSE_WAIT` seconds; one that is still connecting
        then closes its socket itself once the connect returns."""
        if self._abort is not None:
            self._abort()
        with trio.CancelScope(shield=True, deadline=trio.current_time() + CLOSE_WAIT):
            async with self._one_at_a_time:
                self._close()

    # ---- on the exchange's thread ---------------------------------------------------

    def _exchange(self, method: str, path: str, body: bytes | None, abort: _Abort) -> Response:
        started = time.perf_counter()
        try:
            if self._sock is not None and _closed_while_idle(self._sock):
                self._close()
            if self._sock is None:
                self._sock = self._open()
            abort.watch(self._sock)
            try:
                self._sock.sendall(self._head(method, path, body) + (body or b""))
            except OSError as exc:
                raise LoadHTTPError(f"send failed: {exc}") from exc
            response, keep = self._read(self._sock, started)
        except BaseException:
            self._close()
            raise
        if not keep or abort.requested:
            self._close()
        return response

    def _open(self) -> socket.socket:
        try:
            sock = socket.create_connection(
                (self.origin.host, self.origin.port), timeout=CONNECT_TIMEOUT
            )
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.origin.scheme == "https":
                context = ssl.create_default_context()
                sock = context.wrap_socket(sock, server_hostname=self.origin.host)
        except OSError as exc:
            raise LoadHTTPError(f"connect failed: {exc}") from exc
        return sock

    def _head(self, method: str, path: str, body: bytes | None) -> bytes:
        headers = [("Host", self.origin.host_header), *self.origin.headers]
        if body is not None:
            headers += [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        lines = [f"{method} {self.origin.path_prefix + path} HTTP/1.1"]
        lines += [f"{name}: {value}" for name, value in headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _read(self, sock: socket.socket, started: float) -> tuple[Response, bool]:
        """The response on `sock`, and whether the connection may carry another."""
        reader = _Reader()
        arrivals: list[tuple[float, int]] = []
        # The loop runs once per streamed token: locals only, nothing else.
        recv, feed, clock, note = (
            sock.recv,
            reader.parser.feed_data,
            time.perf_counter,
            arrivals.append,
        )
        now = started
        while not reader.complete:
            try:
                data = recv(_READ_SIZE)
            except OSError as exc:
                raise LoadHTTPError(f"receive failed: {exc}") from exc
            now = clock()
            if not data:
                if reader.headers_done and not reader.delimited:
                    break  # a body that ends with the connection
                raise LoadHTTPError("the server closed the connection mid-response")
            size = reader.size
            try:
                feed(data)
            except httptools.HttpParserError as exc:
                raise LoadHTTPError(f"bad HTTP from the server: {exc}") from exc
            if reader.size > size:
                note((now, reader.size))
        keep = reader.complete and reader.keep_alive
        body = b"".join(reader.parts)
        response = Response(reader.status_code, body, started, now, tuple(arrivals))
        return response, keep

    def _close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()


def _closed_while_idle(sock: socket.socket) -> bool:
    """Whether a kept connection has something to read before a request is sent on
    it: the end the server wrote when its keep-alive timeout closed it (or bytes
    nobody asked for). Reusing it would fail the next request, as httpx and urllib3
    know too; they check the same way before reusing a pooled connection."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True  # closed on our side already
    return bool(readable)


def sse_events(body: bytes) -> Iterator[tuple[int, str]]:
    """The server-sent events in `body`, in order, each as (the length of the body up
    to and including the blank line that ends it, its `data`). The lines of a
    multi-line `data` are joined with newlines; comments, other fields and events
    without data are skipped, and so is an unfinished event at the end (as the SSE
    standard has it). Lines end in LF or CRLF."""
    data: list[str] = []
    start = 0
    while True:
        newline = body.find(b"\n", start)
        if newline < 0:
            return
        line = body[start:newline]
        start = newline + 1
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line:  # a blank line dispatches the event
            if data:
                yield start, "\n".join(data)
                data = []
        elif line.startswith(b"data:"):
            value = line[5:]
            data.append((value[1:] if value.startswith(b" ") else value).decode())
