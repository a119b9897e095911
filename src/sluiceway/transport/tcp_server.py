"""hypercorn's trio TCP server, with a send that goes straight out when it can.

For every piece of a response, hypercorn's `TCPServer.protocol_send` takes a
`trio.Lock`, enters a shielded cancel scope and calls `SocketStream.send_all`.
The lock and the socket send each end in a checkpoint that yields to the
scheduler, so one streamed token cost three task steps in the writing task. That
CPU comes out of the model's threads; what this send saved, in server CPU per
token and in throughput, is in `docs/benchmarks.md`.

`ImmediateSendTCPServer.protocol_send` first tries one non-blocking write on the
plain TCP socket when no other send holds the lock. Whatever the kernel does not
take goes out under the lock, shielded, before anything else can be sent, so bytes
are never reordered or torn.

hypercorn's shielded send had no bound: a client that stopped reading held its
request, the tokens queued for it and its connection for as long as it kept the
socket open, and a drain never ended. Here a send that the client takes no bytes
of for `--send-stall-timeout` seconds, or that is still waiting when the drain
ends, resets the connection, which aborts its request (`ConnectionLimits`).

It also half-closes a connection after a response that must be its last (HTTP/1.0,
`Connection: close`), which hypercorn leaves open (`_end_of_connection`).

And it closes a connection as soon as its read loop ends (the client's FIN, a
reset), once no response is left to finish. hypercorn's loop reports the end to
the protocol, which ends a request in progress, but a connection idle between
requests has no request to end: its keep-alive timer went on running, and the
connection's task group, and so its socket, stayed open until it fired (CLOSE-WAIT
for `--keep-alive-timeout` after every client that hung up first, `_read_data`).
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import sys
from contextlib import suppress
from typing import Any

import h11
import hypercorn.protocol
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio import run as hypercorn_run
from hypercorn.trio.tcp_server import TCPServer

from sluiceway.transport import access_log, connection_limits, internals
from sluiceway.transport.h11_protocol import RecyclingH11Protocol

log = logging.getLogger(__name__)


# What a connection beyond `--max-connections` gets before it is closed.
_REFUSAL_BODY = (
    b'{"error": {"message": "The server holds as many connections as it may; retry shortly.", '
    b'"type": "server_overloaded", "param": null, "code": "too_many_connections"}}'
)
_REFUSAL_HEAD = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"retry-after: 1\r\nconnection: close\r\ncontent-length: %d\r\n"
    % len(_REFUSAL_BODY)
)


# How long closing a connection may take (a TLS close_notify to a stalled peer).
_CLOSE_LIMIT_SECONDS = 1.0


class ImmediateSendTCPServer(TCPServer):
    # Set once the read loop has ended: no request can come after that.
    _reading_over: bool = False

    async def run(self) -> None:
        """Serve the connection as hypercorn does, unless the server already holds
        `--max-connections` of them: then answer 503 at once, without reading the
        request, and close."""
        limits = connection_limits.of(self.config)
        if not limits.admit_connection():
            await self._refuse()
            return
        try:
            await super().run()
        finally:
            limits.release_connection()

    async def _read_data(self) -> None:
        """hypercorn's read loop; then, since the connection can serve no further
        request, stops its keep-alive timer, which is all that kept an idle
        connection open. The connection then closes as soon as its last task ends:
        at once when idle, or when a response in progress has ended (hypercorn
        told it the client is gone). Runs the stop shielded: a cancelled reader
        must not leave the timer holding the connection."""
        try:
            await super()._read_data()
        finally:
            self._reading_over = True
            with trio.CancelScope(shield=True):
                await self.idle_task.stop()

    async def _close(self) -> None:
        """Close the socket as hypercorn does, even when the connection's task is
        being cancelled (the end of a drain, a server cancelled in a test): there
        hypercorn's first checkpoint raised and the socket was left for the garbage
        collector to close. Bounded, since a TLS close may wait on its peer."""
        with trio.CancelScope(shield=True, deadline=trio.current_time() + _CLOSE_LIMIT_SECONDS):
            await super()._close()
        if type(self.stream) is trio.SocketStream:
            self.stream.socket.close()  # idempotent; covers a close cut by the deadline

    async def _refuse(self) -> None:
        fd = plain_socket_fd(self.stream)
        if fd is not None:
            with suppress(OSError):
                # Unread, the request has no id of its own to echo: a fresh one.
                request_id = access_log.fresh_id().encode()
                refusal = b"%b%b: %b\r\n\r\n%b" % (
                    _REFUSAL_HEAD, access_log.HEADER, request_id, _REFUSAL_BODY
                )
                os.write(fd, refusal)  # a new socket's buffer takes it whole
        await trio.aclose_forcefully(self.stream)

    async def protocol_send(self, event: Event) -> None:
        """Send `event` as hypercorn would. Not a checkpoint when the bytes go out at
        once. A send in progress is shielded, so a response is never cut in the
        middle of a write, but bounded: a client that takes none of its bytes for
        `--send-stall-timeout` seconds (or any client still being waited on when
        the drain ends, `ConnectionLimits.cut_sends`) has its connection reset,
        which ends its request. After the last bytes of a response that must end
        its connection, half-closes it. Closing and keep-alive bookkeeping run
        shielded: they may be asked for by a request's task that is being
        cancelled, and skipping them leaks the connection."""
        if isinstance(event, RawData):
            await self._send_data(event.data)
            if self._response_must_close():
                await self._end_of_connection()
        elif isinstance(event, Closed | Updated):
            if isinstance(event, Updated) and event.idle and self._reading_over:
                # A response ended after the read loop did (a reset, which h11 never
                # hears of, leaves it ready for a next request that cannot come):
                # waiting for one would only hold the socket for the timer.
                event = Closed()
            with trio.CancelScope(shield=True):
                await super().protocol_send(event)
        else:
            await super().protocol_send(event)

    async def _send_data(self, data: bytes) -> None:
        if not self.send_lock.locked():
            fd = plain_socket_fd(self.stream)
            if fd is not None:
                try:
                    sent = os.write(fd, data)
                except BlockingIOError:
                    sent = 0
                except OSError:
                    sent = -1  # gone: the bounded send below reports Closed
                if sent == len(data):
                    return
                if sent > 0:
                    # Nothing has yielded since the lock was seen free, so it is still
                    # free: take it without a checkpoint, which could be cancelled and
                    # leave the first part of a chunk on the wire without the rest.
                    self.send_lock.acquire_nowait()
                    try:
                        await self._send_bounded(memoryview(data)[sent:])
                    finally:
                        self.send_lock.release()
                    return
        async with self.send_lock:
            await self._send_bounded(memoryview(data))

    async def _send_bounded(self, data: memoryview) -> None:
        """Send all of `data` (the caller holds `send_lock`), shielded from
        cancellation but not from a stalled client: see `protocol_send`."""
        with trio.CancelScope(shield=True):
            try:
                delivered = await self._send_while_client_reads(data)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                await self.protocol.handle(Closed())
                return
            if not delivered:
                log.info("reset a connection whose client took no bytes in time")
                await self._reset()
                await self.protocol.handle(Closed())

    async def _send_while_client_reads(self, data: memoryview) -> bool:
        """Send `data`; False, having sent only part, once the client has taken
        nothing for the stall timeout (each byte it takes restarts the clock)."""
        limits = connection_limits.of(self.config)
        plain = type(self.stream) is trio.SocketStream
        while data:
            with trio.CancelScope(deadline=limits.send_deadline()) as waiting:
                limits.track(waiting)
                if plain:
                    sent = await self.stream.socket.send(data)
                else:  # TLS: the stream sends it all or nothing
                    await self.stream.send_all(data)
                    sent = len(data)
            if waiting.cancelled_caught:
                return False
            data = data[sent:]
        return True

    async def _reset(self) -> None:
        """Close with a reset, not a FIN after the unsent bytes: the kernel drops
        what the client would not take instead of holding it for minutes."""
        sock = getattr(self.stream, "socket", None) or getattr(
            getattr(self.stream, "transport_stream", None), "socket", None
        )
        if sock is not None:
            with suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await trio.aclose_forcefully(self.stream)

    def _response_must_close(self) -> bool:
        # h11 says so after a response to HTTP/1.0 without keep-alive or to
        # `Connection: close`. `self.protocol` is hypercorn's ProtocolWrapper.
        protocol = getattr(getattr(self, "protocol", None), "protocol", None)
        connection = getattr(protocol, "connection", None)
        return isinstance(connection, h11.Connection) and connection.our_state is h11.MUST_CLOSE

    async def _end_of_connection(self) -> None:
        """hypercorn leaves a connection open after a response that h11 says must be
        its last (hypercorn issue #330), so a client reading a body that ends with
        the connection (HTTP/1.0 streaming) waited forever. Half-close it instead:
        the client sees the end and closes, and hypercorn's read loop then closes
        the rest. TLS streams are left to hypercorn."""
        if type(self.stream) is not trio.SocketStream:
            return
        async with self.send_lock:
            with trio.CancelScope(shield=True):
                try:
                    await self.stream.send_eof()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # already gone


def plain_socket_fd(stream: object) -> int | None:
    """The file descriptor of a plain TCP `trio.SocketStream`; None for anything else."""
    if type(stream) is not trio.SocketStream:
        return None  # TLS (trio.SSLStream) or something else: hypercorn's path
    fd = stream.socket.fileno()
    return fd if fd >= 0 else None


class TransportConfig(HypercornConfig):
    """hypercorn's config for a server of ours: a server started with one gets
    `ImmediateSendTCPServer` and `RecyclingH11Protocol`; every other hypercorn
    server in the process keeps hypercorn's own classes."""


class _TCPServerForConfig:
    """Stands in for `TCPServer` in hypercorn's trio worker: builds ours for a
    `TransportConfig` (where a plain `os.write` can send), hypercorn's otherwise."""

    def __new__(cls, app: Any, config: Any, *args: Any) -> Any:
        ours = isinstance(config, TransportConfig) and sys.platform != "win32"
        return (ImmediateSendTCPServer if ours else TCPServer)(app, config, *args)


class _H11ProtocolForConfig:
    """Stands in for `H11Protocol` in hypercorn's `ProtocolWrapper`: builds ours
    for a `TransportConfig`, hypercorn's otherwise."""

    def __new__(cls, app: Any, config: Any, *args: Any, **kwargs: Any) -> Any:
        protocol = RecyclingH11Protocol if isinstance(config, TransportConfig) else H11Protocol
        return protocol(app, config, *args, **kwargs)


def install() -> bool:
    """Let servers started with a `TransportConfig` build their TCP connections with
    `ImmediateSendTCPServer` and their HTTP/1.1 connections with
    `RecyclingH11Protocol`, by putting a stand-in that picks by config in each of
    the two names hypercorn builds them by. Idempotent. Returns False, patching
    nothing, where the private parts these classes override are not as checked
    (`internals.problems()`: each is logged as an error); hypercorn's own classes
    then serve every server."""
    current = (hypercorn_run.TCPServer, hypercorn.protocol.H11Protocol)
    if current == (_TCPServerForConfig, _H11ProtocolForConfig):
        return True
    found = internals.problems()
    if found or current != (TCPServer, H11Protocol):
        for problem in found or ["hypercorn's TCPServer or H11Protocol was replaced by another"]:
            log.error("hypercorn's own transport in use: %s", problem)
        return False
    hypercorn_run.TCPServer = _TCPServerForConfig  # type: ignore[misc,assignment]
    hypercorn.protocol.H11Protocol = _H11ProtocolForConfig  # type: ignore[misc]
    return True
