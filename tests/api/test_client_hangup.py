"""A client that closes its end of a keep-alive connection gets the server's end
closed at once, whatever the connection was doing, instead of the server holding
the socket in CLOSE-WAIT (and its descriptor and connection slot) until the
keep-alive timer fires. The keep-alive timeout here is an hour, so the timer can
never be what closes a connection; every wait is bounded far below it, so a
connection left open fails the test instead of hanging it."""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import h11
import pytest
import trio
import trio.testing
from hypercorn.events import Closed

from server_helpers import CHAT, chat
from sluiceway.transport import connection_limits
from sluiceway.transport.h11_protocol import RecyclingH11Protocol

from .fakes import ScriptedRunner

KEEP_ALIVE_S = 3600.0
LIMIT_S = 10.0
BURST = 20
KEY = "secret"
_CLOSE_WAIT = "08"  # the TCP state's code in /proc/net/tcp


def close_wait_sockets(port: int) -> int:
    """Sockets on local port `port` (the server's side) in CLOSE-WAIT: the client
    has closed, the server not yet."""
    count = 0
    for table in (Path("/proc/net/tcp"), Path("/proc/net/tcp6")):
        if not table.exists():
            continue
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            local, state = fields[1], fields[3]
            if int(local.rsplit(":", 1)[1], 16) == port and state == _CLOSE_WAIT:
                count += 1
    return count


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@pytest.fixture
def limits(monkeypatch: pytest.MonkeyPatch) -> list[connection_limits.ConnectionLimits]:
    """The connection limits of the servers the test starts: their count of open
    connections falls only when a connection's task has ended."""
    attached: list[connection_limits.ConnectionLimits] = []
    attach = connection_limits.attach

    def recording_attach(config: Any, limits: connection_limits.ConnectionLimits) -> None:
        attached.append(limits)
        attach(config, limits)

    monkeypatch.setattr(connection_limits, "attach", recording_attach)
    return attached


async def assert_all_closed(url: str, limits: list[connection_limits.ConnectionLimits]) -> None:
    """No socket of the server's left in CLOSE-WAIT, and no connection still held."""
    await trio.testing.wait_all_tasks_blocked()
    assert close_wait_sockets(port_of(url)) == 0
    assert [each.open_connections for each in limits] == [0]


class Client:
    """One keep-alive HTTP/1.1 connection; h11 frames the requests and parses the
    responses, the test decides when each byte goes out and when to hang up."""

    def __init__(self, sock: trio.SocketStream) -> None:
        self.sock = sock
        self.parser = h11.Connection(h11.CLIENT)

    @classmethod
    async def connect(cls, url: str) -> Client:
        host, port = url.removeprefix("http://").split(":")
        return cls(await trio.open_tcp_stream(host, int(port)))

    async def send_head(
        self, method: str, path: str, *, length: int = 0, key: str | None = KEY
    ) -> None:
        if self.parser.our_state is h11.DONE and self.parser.their_state is h11.DONE:
            self.parser.start_next_cycle()
        headers = [("Host", "test"), ("Content-Length", str(length))]
        if length:
            headers.append(("Content-Type", "application/json"))
        if key is not None:
            headers.append(("Authorization", f"Bearer {key}"))
        request = h11.Request(method=method, target=path, headers=headers)
        await self.sock.send_all(self.parser.send(request) or b"")

    async def send_body(self, data: bytes, *, end: bool = True) -> None:
        out = self.parser.send(h11.Data(data=data)) or b""
        if end:
            out += self.parser.send(h11.EndOfMessage()) or b""
        await self.sock.send_all(out)

    async def next_event(self) -> Any:
        while (event := self.parser.next_event()) is h11.NEED_DATA:
            self.parser.receive_data(await self.sock.receive_some(65536))
        return event

    async def response_head(self) -> int:
        event = await self.next_event()
        assert isinstance(event, h11.Response), event
        return event.status_code

    async def rest_of_response(self) -> bytes:
        body = b""
        while not isinstance(event := await self.next_event(), h11.EndOfMessage):
            assert isinstance(event, h11.Data), event
            body += event.data
        return body

    async def request(self, method: str, path: str, body: bytes = b"") -> int:
        """A whole request and its whole response, the connection kept alive."""
        await self.send_head(method, path, length=len(body))
        await self.send_body(body)
        status = await self.response_head()
        await self.rest_of_response()
        return status

    async def hang_up(self) -> bool:
        """Close the client's end (a FIN) and read until the server closes its end
        too: True when it does within `LIMIT_S` (a reset counts), False when the
        connection is still open then."""
        await self.sock.send_eof()
        with trio.move_on_after(LIMIT_S):
            try:
                while await self.sock.receive_some(65536):
                    pass
            except trio.BrokenResourceError:
                pass
            return True
        return False

    async def aclose(self) -> None:
        await self.sock.aclose()


async def _served_then_closed(url: str, path: str, left_open: list[str]) -> None:
    client = await Client.connect(url)
    try:
        with trio.fail_after(LIMIT_S):
            assert await client.request("GET", path) == 200
        if not await client.hang_up():
            left_open.append(path)
    finally:
        await client.aclose()


@pytest.mark.parametrize("path", ["/health", "/v1/models"])
async def test_a_burst_of_clients_that_close_after_one_request_leaves_none_open(
    start_server: Any, limits: list[connection_limits.ConnectionLimits], path: str
) -> None:
    """Each keep-alive client sends one request, reads its response and closes, as
    health checkers and short-lived clients do."""
    async with start_server(keep_alive_timeout=KEEP_ALIVE_S) as server:
        left_open: list[str] = []
        async with trio.open_nursery() as nursery:
            for _ in range(BURST):
                nursery.start_soon(_served_then_closed, server.url, path, left_open)
        assert not left_open, f"{len(left_open)} of {BURST} connections left open"
        await assert_all_closed(server.url, limits)


# Each opens a connection and brings it to one state, in which the client hangs up.
State = Callable[[str, ScriptedRunner], Awaitable[Client]]


def idle_after(method: str, path: str, body: dict[str, Any] | None = None) -> State:
    """Kept alive and idle (the keep-alive timer running) after a whole exchange."""

    async def state(url: str, runner: ScriptedRunner) -> Client:
        client = await Client.connect(url)
        data = json.dumps(body).encode() if body is not None else b""
        assert await client.request(method, path, data) == 200
        return client

    return state


async def mid_request_head(url: str, runner: ScriptedRunner) -> Client:
    client = await Client.connect(url)
    assert await client.request("GET", "/v1/models") == 200
    await client.sock.send_all(b"GET /v1/models HTTP/1.1\r\nHost: test\r\n")  # no blank line
    return client


async def mid_request_body(url: str, runner: ScriptedRunner) -> Client:
    client = await Client.connect(url)
    await client.send_head("POST", CHAT, length=1000)
    await client.send_body(b'{"model": ', end=False)
    return client


async def discarding_body_after_early_reply(url: str, runner: ScriptedRunner) -> Client:
    client = await Client.connect(url)
    await client.send_head("POST", CHAT, length=10_000, key=None)  # 401 before the body
    assert await client.response_head() == 401
    await client.rest_of_response()
    await client.send_body(b"{" * 100, end=False)
    return client


async def streaming_response(url: str, runner: ScriptedRunner) -> Client:
    runner.gated = True  # no step runs: the stream's body waits for its next token
    client = await Client.connect(url)
    body = json.dumps(chat("hold", max_tokens=50, stream=True)).encode()
    await client.send_head("POST", CHAT, length=len(body))
    await client.send_body(body)
    assert await client.response_head() == 200
    return client


STATES: dict[str, State] = {
    "idle after /health": idle_after("GET", "/health"),
    "idle after a JSON response": idle_after("GET", "/v1/models"),
    "idle after a completion": idle_after("POST", CHAT, chat("hi", max_tokens=3)),
    "idle after a stream": idle_after("POST", CHAT, chat("hi", max_tokens=3, stream=True)),
    "mid request head": mid_request_head,
    "mid request body": mid_request_body,
    "discarding a body after an early reply": discarding_body_after_early_reply,
    "streaming a response": streaming_response,
}


@pytest.mark.parametrize("state", list(STATES))
async def test_a_client_that_closes_gets_the_connection_closed_in_every_state(
    start_server: Any,
    runner: ScriptedRunner,
    limits: list[connection_limits.ConnectionLimits],
    state: str,
) -> None:
    async with start_server(keep_alive_timeout=KEEP_ALIVE_S, api_keys=(KEY,)) as server:
        with trio.fail_after(LIMIT_S):
            client = await STATES[state](server.url, runner)
        try:
            # The server has taken all it was sent and done everything that follows
            # (a response recycled, the keep-alive timer started) before the FIN.
            await trio.testing.wait_all_tasks_blocked()
            assert await client.hang_up(), f"{state}: the server kept the connection open"
        finally:
            await client.aclose()
        await assert_all_closed(server.url, limits)


@pytest.fixture
def read_ended(monkeypatch: pytest.MonkeyPatch) -> trio.Event:
    """Set once a connection's read loop has ended and told its protocol so."""
    ended = trio.Event()
    handle = RecyclingH11Protocol.handle

    async def noting_the_end(self: RecyclingH11Protocol, event: Any) -> None:
        if isinstance(event, Closed):
            ended.set()
        await handle(self, event)

    monkeypatch.setattr(RecyclingH11Protocol, "handle", noting_the_end)
    return ended


def hold_recycling_until(ended: trio.Event, monkeypatch: pytest.MonkeyPatch) -> None:
    """The end of a response (its bytes are out) readies the connection for its next
    request only once `ended` is set."""
    maybe_recycle = RecyclingH11Protocol._maybe_recycle

    async def recycle_after(self: RecyclingH11Protocol) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(LIMIT_S):
            await ended.wait()
        await maybe_recycle(self)

    monkeypatch.setattr(RecyclingH11Protocol, "_maybe_recycle", recycle_after)


@pytest.mark.parametrize("recycled_first", [True, False], ids=["recycled", "not yet recycled"])
@pytest.mark.parametrize("hang_up", ["fin", "reset"])
async def test_a_client_that_hangs_up_after_its_response_is_released_whenever_it_does(
    start_server: Any,
    limits: list[connection_limits.ConnectionLimits],
    read_ended: trio.Event,
    monkeypatch: pytest.MonkeyPatch,
    recycled_first: bool,
    hang_up: str,
) -> None:
    """The client has the whole response and hangs up, before or after the server
    has readied the connection for a next request. A reset is never seen by h11,
    so the response's end still finds the connection ready for more."""
    if not recycled_first:
        hold_recycling_until(read_ended, monkeypatch)
    async with start_server(keep_alive_timeout=KEEP_ALIVE_S) as server:
        client = await Client.connect(server.url)
        try:
            with trio.fail_after(LIMIT_S):
                assert await client.request("GET", "/v1/models") == 200
            if recycled_first:
                await trio.testing.wait_all_tasks_blocked()
            assert not read_ended.is_set()
            if hang_up == "fin":
                assert await client.hang_up(), "the server kept the connection open"
            else:
                client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                await client.aclose()
                with trio.fail_after(LIMIT_S):
                    await read_ended.wait()
        finally:
            await client.aclose()
        await assert_all_closed(server.url, limits)
