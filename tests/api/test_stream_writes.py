"""A streaming response's output: events go straight to the socket when nothing is
queued before them, queue otherwise, and are never reordered; queued events go out
together as one write."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from sluiceway.api.http.stream_output import StreamOutput


class FakeChunkSocket:
    """A direct path that takes `accept` bytes of each framed write (None: all), or
    refuses with `error`; records what reached the wire and in which order."""

    def __init__(self) -> None:
        self.wire: list[bytes] = []
        self.is_ready = True
        self.accept: int | None = None
        self.error: OSError | None = None
        self.rest_sent = trio.Event()

    def ready(self) -> bool:
        return self.is_ready

    def write_nowait(self, data: bytes) -> bytes | None:
        if self.error is not None:
            raise self.error
        framed = b"<" + data + b">"  # stands in for the chunk framing
        taken = len(framed) if self.accept is None else self.accept
        self.wire.append(framed[:taken])
        return framed[taken:] if taken < len(framed) else None

    async def send_rest(self, rest: bytes) -> None:
        await trio.lowlevel.checkpoint()
        self.wire.append(rest)
        self.rest_sent.set()


async def drain(output: StreamOutput, socket: FakeChunkSocket | None = None) -> list[bytes]:
    """Run the body to its end; body writes land on `socket.wire` as `[...]`."""
    writes = []
    async for chunk in output.body():
        writes.append(chunk)
        if socket is not None:
            socket.wire.append(b"[" + chunk + b"]")
    return writes


async def body_sending_a(output: StreamOutput, socket: FakeChunkSocket) -> Any:
    """Queue "a" before the socket is ready, then let the body take it: the body is
    left in the middle of sending "a" (quart's send), and is returned."""
    socket.is_ready = False
    output.put(b"a")
    socket.is_ready = True
    body = output.body()
    assert await body.__anext__() == b"a"
    return body


async def test_events_that_queued_up_go_out_as_one_write():
    output = StreamOutput()
    for event in (b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"):
        output.put(event)
    output.close()
    assert await drain(output) == [b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"]


async def test_an_event_is_written_as_soon_as_it_exists():
    output = StreamOutput()
    body = output.body()
    output.put(b"data: 1\n\n")
    assert await body.__anext__() == b"data: 1\n\n"  # nothing else queued: no waiting
    output.put(b"data: 2\n\n")
    output.close()
    assert [chunk async for chunk in body] == [b"data: 2\n\n"]


async def test_an_idle_output_writes_straight_to_the_socket():
    socket = FakeChunkSocket()
    output = StreamOutput(socket)
    with trio.testing.assert_no_checkpoints():
        output.put(b"a")
        output.put(b"b")
    output.close()
    assert await drain(output, socket) == []  # the body had nothing to send
    assert socket.wire == [b"<a>", b"<b>"]


async def test_events_queue_until_the_socket_is_ready():
    socket = FakeChunkSocket()
    socket.is_ready = False  # e.g. the response head has not gone out yet
    output = StreamOutput(socket)
    output.put(b"a")
    socket.is_ready = True
    output.put(b"b")  # behind a queued event: it queues too
    output.close()
    assert await drain(output, socket) == [b"ab"]
    assert socket.wire == [b"[ab]"]


async def test_a_partial_write_sends_its_rest_before_anything_else():
    socket = FakeChunkSocket()
    output = StreamOutput(socket)
    socket.accept = 2
    output.put(b"first")  # "<f" reaches the wire, "irst>" is left over
    socket.accept = None
    output.put(b"second")  # must not overtake the rest: it queues
    output.put(b"third")
    output.close()
    assert await drain(output, socket) == [b"secondthird"]
    assert socket.wire == [b"<f", b"irst>", b"[secondthird]"]


async def test_puts_while_the_body_sends_queue_behind_it():
    socket = FakeChunkSocket()
    output = StreamOutput(socket)
    body = await body_sending_a(output, socket)  # quart is now sending "a"
    output.put(b"b")  # so this must wait behind it
    assert socket.wire == []
    got: list[bytes] = []

    async def send_the_rest() -> None:
        got.extend([chunk async for chunk in body])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_the_rest)
        await trio.testing.wait_all_tasks_blocked()  # "b" sent; the body waits for more
        output.put(b"c")  # nothing queued, the body idle: straight out
        assert socket.wire == [b"<c>"]
        output.close()
    assert got == [b"b"]


async def test_a_failed_direct_write_falls_back_to_the_body_for_good():
    socket = FakeChunkSocket()
    output = StreamOutput(socket)
    socket.error = BrokenPipeError()
    output.put(b"a")
    socket.error = None
    output.put(b"b")
    output.close()
    assert await drain(output, socket) == [b"ab"]
    assert socket.wire == [b"[ab]"]


async def test_puts_after_the_body_is_gone_raise_broken():
    socket = FakeChunkSocket()
    output = StreamOutput(socket)
    body = await body_sending_a(output, socket)
    await body.aclose()  # quart closes the body when the response ends early
    with pytest.raises(trio.BrokenResourceError):
        output.put(b"b")
    assert socket.wire == []


async def test_puts_after_close_raise_closed():
    output = StreamOutput(FakeChunkSocket())
    output.close()
    with pytest.raises(trio.ClosedResourceError):
        output.put(b"a")
