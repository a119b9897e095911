"""The server tells the engine which requests are still being prepared, so that an
idle engine holds its first step for the rest of a burst (`engine.arrivals`): a
POST counts from the moment the app has it until its route has it ready for the
engine, or until it ends."""

from __future__ import annotations

from polling import eventually
from server_helpers import CHAT, RawStream, chat
from sluiceway.api.serve import RunningServer


def _preparing(server: RunningServer) -> int:
    return server.state.engine.arrivals.preparing_count


async def test_a_request_counts_while_its_body_is_coming_and_not_once_it_streams(
    server: RunningServer,
):
    request = RawStream.request_bytes(server.url, CHAT, chat("hi", max_tokens=40, stream=True))
    head, body = request.split(b"\r\n\r\n", 1)
    raw = await RawStream.connect(server.url)
    try:
        await raw.sock.send_all(head + b"\r\n\r\n" + body[:5])
        await eventually(lambda: _preparing(server) == 1)
        await raw.sock.send_all(body[5:])
        await raw.read_until(lambda got: b"data: " in got)  # the stream has begun
        # Ready for the engine, the request no longer holds anyone's first step,
        # though its response is still going.
        assert _preparing(server) == 0
        await raw.read_to_end()
    finally:
        await raw.sock.aclose()


async def test_a_request_that_fails_its_preparation_stops_counting(server: RunningServer):
    raw = await RawStream.post(server.url, CHAT, {"model": "test-model", "messages": "no"})
    try:
        await raw.read_until(lambda got: b"invalid_request_error" in got)
    finally:
        await raw.sock.aclose()
    await eventually(lambda: _preparing(server) == 0)


async def test_a_client_that_leaves_mid_upload_stops_counting(server: RunningServer):
    request = RawStream.request_bytes(server.url, CHAT, chat("hi"))
    raw = await RawStream.connect(server.url)
    await raw.sock.send_all(request[:-5])
    await eventually(lambda: _preparing(server) == 1)
    await raw.sock.aclose()
    await eventually(lambda: _preparing(server) == 0)
