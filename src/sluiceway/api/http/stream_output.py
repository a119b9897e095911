"""Where one streaming response's SSE bytes go: straight onto the socket when nothing
is queued before them, else into a queue that the response body sends.

The per-choice consumers `put` events; a put never blocks, so a reader that stops
reading holds up neither the consumers nor the engine, and the request's deadline
still ends its engine work. When the connection has a `ChunkSocket` that is ready,
the body is idle and nothing is queued, an event is written as an HTTP/1.1 chunk
from the consumer's own task step. Otherwise it is queued, and the body (iterated
by quart in the response's task) sends it through ASGI. Bytes are never
reordered: while anything is queued or the body is sending, everything queues.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator
from typing import Protocol

import attrs
import trio


class ChunkWriter(Protocol):
    """What `StreamOutput` needs of a direct path (`chunk_socket.ChunkSocket`)."""

    def ready(self) -> bool: ...

    def write_nowait(self, data: bytes) -> bytes | None: ...

    async def send_rest(self, rest: bytes) -> None: ...


@attrs.frozen
class _Rest:
    """Framed bytes a direct write left over: they go out before anything else."""

    data: bytes


class StreamOutput:
    """One streaming response's output; `direct` is its socket's chunk writer, or
    None where there is none (every event then goes through the body)."""

    def __init__(self, direct: ChunkWriter | None = None) -> None:
        self._direct = direct
        self._rest_writer = direct  # kept when `_direct` is dropped after an error
        self._send, self._receive = trio.open_memory_channel[bytes | _Rest](math.inf)
        self._queued = 0
        self._body_busy = False  # the body holds items it has not finished sending
        self._body_gone = False
        self._closed = False

    def put(self, data: bytes) -> None:
        """Send `data` (whole SSE events) after everything put before it. Never
        blocks. Raises trio.ClosedResourceError after `close`, and
        trio.BrokenResourceError once the body has gone (the response ended early:
        the client is gone)."""
        if not data:
            return
        direct = self._direct
        if (
            direct is not None
            and not self._queued
            and not self._body_busy
            and not self._body_gone
            and not self._closed
            and direct.ready()
        ):
            try:
                rest = direct.write_nowait(data)
            except OSError:
                # The connection is gone; the ASGI path reports that as hypercorn does.
                self._direct = None
            else:
                if rest is not None:
                    self._enqueue(_Rest(rest))
                return
        self._enqueue(data)

    def _enqueue(self, item: bytes | _Rest) -> None:
        self._send.send_nowait(item)
        self._queued += 1

    def close(self) -> None:
        """No more puts: the body ends once it has sent what is queued."""
        self._closed = True
        self._send.close()

    async def body(self) -> AsyncIterator[bytes]:
        """The response body for quart: the queued bytes in order. Events that queued
        up while the previous write was in progress go out together as one write, so
        a busy server makes fewer socket writes. Closing the body (quart does when
        the response ends early) makes later puts raise BrokenResourceError."""
        try:
            async with self._receive:
                async for item in self._receive:
                    self._body_busy = True
                    items = [item]
                    with contextlib.suppress(trio.WouldBlock, trio.EndOfChannel):
                        while True:
                            items.append(self._receive.receive_nowait())
                    self._queued -= len(items)
                    run: list[bytes] = []
                    for each in items:
                        if isinstance(each, _Rest):
                            if run:
                                yield b"".join(run)
                                run = []
                            assert self._rest_writer is not None
                            await self._rest_writer.send_rest(each.data)
                        else:
                            run.append(each)
                    if run:
                        yield b"".join(run)  # the same object when there is one part
                    self._body_busy = False
        finally:
            self._body_gone = True
