"""The immediate send: bytes the kernel takes at once skip hypercorn's lock and
checkpoints; anything else goes out whole, in order, through hypercorn's path."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any

import h11
import pytest
import trio
import trio.testing
from hypercorn.config import Config
from hypercorn.events import Closed, RawData
from hypercorn.trio import run as hypercorn_run
from hypercorn.trio.worker_context import WorkerContext

from server_helpers import CHAT, RawStream, chat
from sluiceway.transport import tcp_server
from sluiceway.transport.tcp_server import ImmediateSendTCPServer


class RecordingProtocol:
    def __init__(self) -> None:
        self.events: list[object] = []

    async def handle(self, event: object) -> None:
        self.events.append(event)


def make_server(stream: trio.abc.Stream) -> tuple[ImmediateSendTCPServer, RecordingProtocol]:
    server = ImmediateSendTCPServer(None, Config(), WorkerContext(None), {}, stream)  # type: ignore[arg-type]
    protocol = RecordingProtocol()
    server.protocol = protocol  # type: ignore[assignment]
    return server, protocol


@pytest.fixture
async def pair() -> AsyncIterator[tuple[trio.SocketStream, trio.SocketStream]]:
    """A connected pair with small buffers, so a large write only partly fits."""
    a, b = trio.socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    near, far = trio.SocketStream(a), trio.SocketStream(b)
    yield near, far
    await near.aclose()
    await far.aclose()


async def read_exactly(stream: trio.SocketStream, size: int) -> bytes:
    """`size` bytes; fails (rather than hangs) when the writer stops short."""
    got = bytearray()
    with trio.fail_after(10):
        while len(got) < size:
            chunk = await stream.receive_some(size - len(got))
            assert chunk, "the writer closed early"
            got += chunk
    return bytes(got)


def test_install_leaves_a_worker_it_does_not_recognise_alone(monkeypatch: pytest.MonkeyPatch):
    class SomeOtherServer:
        pass

    monkeypatch.setattr(hypercorn_run, "TCPServer", SomeOtherServer)
    assert not tcp_server.install()
    assert hypercorn_run.TCPServer is SomeOtherServer


async def test_a_send_the_socket_takes_whole_is_not_a_checkpoint(pair):
    near, far = pair
    server, protocol = make_server(near)
    with trio.testing.assert_no_checkpoints():
        await server.protocol_send(RawData(data=b"data: 1\n\n"))
    assert await read_exactly(far, 9) == b"data: 1\n\n"
    assert protocol.events == []


async def test_the_rest_of_a_partial_write_goes_out_before_a_later_send(pair):
    near, far = pair
    server, _ = make_server(near)
    big = bytes(range(256)) * 4096  # 1 MiB: far more than the socket buffers take
    small = b"data: after\n\n"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.protocol_send, RawData(data=big))
        await trio.testing.wait_all_tasks_blocked()
        assert server.send_lock.locked()  # the first send's rest is waiting to go out
        nursery.start_soon(server.protocol_send, RawData(data=small))
        await trio.testing.wait_all_tasks_blocked()
        received = await read_exactly(far, len(big) + len(small))
    assert received == big + small


async def test_a_cancelled_send_still_finishes_its_write(pair):
    near, far = pair
    server, _ = make_server(near)
    big = b"x" * (1 << 20)
    sender_scope = trio.CancelScope()

    async def send() -> None:
        with sender_scope:
            await server.protocol_send(RawData(data=big))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        await trio.testing.wait_all_tasks_blocked()
        sender_scope.cancel()  # the sender is shielded until its bytes are out
        received = await read_exactly(far, len(big))
    assert received == big
    assert not server.send_lock.locked()


async def test_a_peer_that_has_gone_is_reported_as_closed(pair):
    near, far = pair
    server, protocol = make_server(near)
    await far.aclose()
    await server.protocol_send(RawData(data=b"data: 1\n\n"))
    assert [type(e) for e in protocol.events] == [Closed]


async def test_a_send_while_the_lock_is_held_waits_its_turn(pair):
    near, far = pair
    server, _ = make_server(near)
    async with trio.open_nursery() as nursery:
        await server.send_lock.acquire()
        nursery.start_soon(server.protocol_send, RawData(data=b"second"))
        await trio.testing.wait_all_tasks_blocked()
        await near.send_all(b"first ")  # the lock holder's bytes
        server.send_lock.release()
    assert await read_exactly(far, 12) == b"first second"


async def test_streams_that_are_not_plain_sockets_take_hypercorns_path():
    near, far = trio.testing.memory_stream_pair()  # as a TLS stream would: no socket
    server, _ = make_server(near)
    with trio.testing.assert_checkpoints():
        await server.protocol_send(RawData(data=b"data: 1\n\n"))
    assert await far.receive_some() == b"data: 1\n\n"


async def _read_until_closed(sock: trio.SocketStream) -> bytes:
    got = b""
    with trio.fail_after(20):
        while chunk := await sock.receive_some(65536):
            got += chunk
    return got


@pytest.mark.parametrize("stream", [False, True])
async def test_a_response_to_connection_close_ends_the_connection(
    start_server: Any, stream: bool
) -> None:
    """hypercorn keeps such a connection open (its issue #330): a client waiting for
    the end of the connection, as HTTP/1.0 and `Connection: close` clients may,
    would wait forever."""
    async with start_server() as server:
        raw = await RawStream.connect(server.url)
        body = chat("bye", max_tokens=3, stream=stream)
        await raw.sock.send_all(
            RawStream.request_bytes(server.url, CHAT, body)
        )  # Connection: close
        got = await _read_until_closed(raw.sock)
        await raw.aclose()
    assert got.startswith(b"HTTP/1.1 200")
    assert (b"data: [DONE]" in got) if stream else got.endswith(b"}")


async def test_keep_alive_connections_stay_open(start_server: Any) -> None:
    async with start_server() as server:
        raw = await RawStream.connect(server.url)
        request = RawStream.request_bytes(server.url, CHAT, chat("again", max_tokens=2))
        request = request.replace(b"Connection: close\r\n", b"")
        client = h11.Connection(h11.CLIENT)
        with trio.fail_after(20):
            for _ in range(3):  # three requests, one connection
                await raw.sock.send_all(request)
                client.send(h11.Request(method="POST", target=CHAT, headers=[("Host", "x")]))
                client.send(h11.EndOfMessage())
                status = 0
                while (event := client.next_event()) is not h11.PAUSED:
                    if event is h11.NEED_DATA:
                        client.receive_data(await raw.sock.receive_some(65536))
                    elif isinstance(event, h11.Response):
                        status = event.status_code
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    elif isinstance(event, h11.ConnectionClosed):
                        raise AssertionError("the server closed a keep-alive connection")
                assert status == 200
                client.start_next_cycle()
        await raw.aclose()
