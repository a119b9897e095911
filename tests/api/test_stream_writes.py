"""The streaming response body writes queued SSE events together."""

from __future__ import annotations

import math

import trio

from sluiceway.api.routes_generation import _read


async def test_events_that_queued_up_go_out_as_one_write():
    send, receive = trio.open_memory_channel[bytes](math.inf)
    for event in (b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"):
        send.send_nowait(event)
    send.close()
    writes = [chunk async for chunk in _read(receive)]
    assert writes == [b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"]


async def test_an_event_is_written_as_soon_as_it_exists():
    send, receive = trio.open_memory_channel[bytes](math.inf)
    body = _read(receive)
    send.send_nowait(b"data: 1\n\n")
    assert await body.__anext__() == b"data: 1\n\n"  # nothing else queued: no waiting
    send.send_nowait(b"data: 2\n\n")
    send.close()
    assert [chunk async for chunk in body] == [b"data: 2\n\n"]
