"""Writing a streaming response's HTTP/1.1 chunks straight onto its TCP socket.

Through ASGI, each streamed event went from the consumer that formatted it to the
response body's task (a task switch), then through quart's send loop, hypercorn's
`HTTPStream.app_send` and `H11Protocol.stream_send`, h11's state machine and chunk
writer, and `ImmediateSendTCPServer.protocol_send`. `ChunkSocket` lets the consumer
frame the chunk itself and write it with one non-blocking `os.write`, when that
sends exactly the bytes h11 would have sent: the response's head has gone out, h11
frames its body in chunks (HTTP/1.1, no Content-Length), and no other send is in
progress on the connection. h11 keeps no count of chunks, so its state stays right.

This cuts the event loop's CPU per streamed token by about a third at many
streams (`docs/benchmarks.md`).

Anything else (HTTP/2, TLS, HTTP/1.0, another ASGI server, hypercorn internals that
no longer look as this was written against) gets no `ChunkSocket`, and the events
take the ASGI path as before.
"""

from __future__ import annotations

import os
from typing import Any

import h11
from hypercorn.events import RawData
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.protocol.http_stream import HTTPStream

from sluiceway.transport.tcp_server import ImmediateSendTCPServer, plain_socket_fd

try:  # h11's chunk writer is private; without it there is no direct path
    from h11._writers import ChunkedWriter
except ImportError:  # pragma: no cover - depends on the installed h11
    ChunkedWriter = None  # type: ignore[assignment,misc]


def frame(data: bytes) -> bytes:
    """`data` as one HTTP/1.1 chunk, byte for byte as h11's ChunkedWriter writes it."""
    return b"%x\r\n%b\r\n" % (len(data), data)


class ChunkSocket:
    """The plain TCP socket under one HTTP/1.1 response that hypercorn sends."""

    def __init__(self, server: ImmediateSendTCPServer, connection: h11.Connection, fd: int):
        """Use `of`: it checks that the objects are what they must be."""
        self._server = server
        self._connection = connection
        self._fd = fd

    @classmethod
    def of(cls, asgi_send: Any) -> ChunkSocket | None:
        """The socket under `asgi_send` when that is hypercorn's HTTP/1.1 send over a
        plain TCP socket served by `ImmediateSendTCPServer`; None otherwise."""
        if ChunkedWriter is None:
            return None
        stream = getattr(asgi_send, "__self__", None)
        if not isinstance(stream, HTTPStream):
            return None
        protocol = getattr(stream.send, "__self__", None)
        if not isinstance(protocol, H11Protocol) or not isinstance(
            protocol.connection, h11.Connection
        ):
            return None
        server = getattr(protocol.send, "__self__", None)
        if not isinstance(server, ImmediateSendTCPServer):
            return None
        fd = plain_socket_fd(server.stream)
        if fd is None:
            return None
        return cls(server, protocol.connection, fd)

    def ready(self) -> bool:
        """Whether a chunk written now is what h11 would send next: the head has gone
        out, the body is framed in chunks, and no send holds the connection."""
        connection = self._connection
        return (
            connection.our_state is h11.SEND_BODY
            and type(getattr(connection, "_writer", None)) is ChunkedWriter
            and not self._server.send_lock.locked()
        )

    def write_nowait(self, data: bytes) -> bytes | None:
        """Write `data` (not empty) as one chunk, as much as the kernel takes now,
        without blocking. Returns None when all of it went; otherwise the framed
        bytes still to send, which must go out next, before anything else on this
        connection (`send_rest`). Raises OSError, having written nothing, when the
        connection is gone. Call only when `ready()`."""
        framed = frame(data)
        try:
            sent = os.write(self._fd, framed)
        except BlockingIOError:
            sent = 0
        if sent == len(framed):
            return None
        return framed[sent:]

    async def send_rest(self, rest: bytes) -> None:
        """Send bytes that `write_nowait` left over, through hypercorn's own path (a
        closed connection is reported to hypercorn as usual). Cancellation behaves as
        in hypercorn: once bytes are on their way, the send finishes."""
        await self._server.protocol_send(RawData(data=rest))
