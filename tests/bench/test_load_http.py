"""The load generator's HTTP client against a scripted h11 server on loopback."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial

import h11
import pytest
import trio
import trio.testing

from sluiceway.bench.load_http import Connection, LoadHTTPError, Origin, Response, sse_events
from sluiceway.bench.serve_load import LoadSpec, _probe_health, timed_request

Reply = Callable[[h11.Connection, trio.SocketStream, h11.Request, bytes], Awaitable[bool]]


async def _serve_connection(
    reply: Reply, log: list[tuple[int, str, bytes]], opened: list[int], stream: trio.SocketStream
) -> None:
    """Answer requests on one connection with `reply` until it returns False or the
    client leaves. `log` gets (connection number, target, body) per request."""
    number = opened[0]
    opened[0] += 1
    conn = h11.Connection(h11.SERVER)
    async with stream:
        while True:
            request: h11.Request | None = None
            body = b""
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    conn.receive_data(data)
                elif isinstance(event, h11.Request):
                    request = event
                elif isinstance(event, h11.Data):
                    body += bytes(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif isinstance(event, h11.ConnectionClosed):
                    return
            assert request is not None
            log.append((number, request.target.decode(), body))
            if not await reply(conn, stream, request, body):
                return
            conn.start_next_cycle()


@asynccontextmanager
async def scripted_server(reply: Reply) -> AsyncIterator[tuple[str, list[tuple[int, str, bytes]]]]:
    log: list[tuple[int, str, bytes]] = []
    handler = partial(_serve_connection, reply, log, [0])
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        yield f"http://127.0.0.1:{port}", log
        nursery.cancel_scope.cancel()


def sse_body(*events: str) -> bytes:
    return b"".join(f"data: {e}\n\n".encode() for e in events)


async def _send(
    conn: h11.Connection,
    stream: trio.SocketStream,
    status: int,
    parts: list[bytes],
    *,
    close: bool = False,
) -> None:
    headers = [("Content-Type", "text/event-stream"), ("Transfer-Encoding", "chunked")]
    if close:
        headers.append(("Connection", "close"))
    out = conn.send(h11.Response(status_code=status, headers=headers)) or b""
    await stream.send_all(out)
    for part in parts:
        await stream.send_all(conn.send(h11.Data(data=part)) or b"")
    await stream.send_all(conn.send(h11.EndOfMessage()) or b"")


def streamed_reply(*, close: bool = False) -> Reply:
    async def reply(
        conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, body: bytes
    ) -> bool:
        chunk = '{"choices":[{"index":0,"delta":{"content":"hi"}}]}'
        usage = '{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}'
        await _send(
            conn, stream, 200, [sse_body(chunk, chunk), sse_body(usage, "[DONE]")], close=close
        )
        return not close

    return reply


def test_sse_events_end_where_their_blank_line_ends() -> None:
    stream = (
        b": comment\r\nevent: x\r\ndata: one\r\n\r\ndata: two\ndata:  three\n\nid: 4\n\ndata: last"
    )
    events = list(sse_events(stream))
    assert [data for _, data in events] == ["one", "two\n three"]  # "last" never ended
    first = stream.index(b"\r\n\r\n") + 4
    second = stream.index(b"\n\nid") + 2
    assert [end for end, _ in events] == [first, second]


def test_an_event_arrives_with_the_read_that_brought_its_last_byte() -> None:
    response = Response(200, b"x" * 30, 0.0, 4.0, ((1.0, 10), (2.0, 20), (3.0, 30)))
    assert [response.arrival(end) for end in (1, 10, 11, 20, 21, 30)] == [
        1.0,
        1.0,
        2.0,
        2.0,
        3.0,
        3.0,
    ]


async def test_requests_reuse_one_connection_and_carry_path_and_headers() -> None:
    async with scripted_server(streamed_reply()) as (url, log):
        origin = Origin.from_url(url + "/prefix", {"Authorization": "Bearer k"})
        connection = Connection(origin)
        spec = LoadSpec(model="m", output_tokens=2)
        records = [await timed_request(connection, spec, f"prompt {i}") for i in range(3)]
        await connection.aclose()
    assert [r.error for r in records] == [None, None, None]
    assert [(len(r.chunk_times), r.usage_tokens, r.prompt_tokens) for r in records] == [
        (2, 2, 3)
    ] * 3
    served = [(n, target) for n, target, _ in log]
    assert served == [(0, "/prefix/v1/chat/completions")] * 3  # one connection for all three
    assert b'"prompt 2"' in log[-1][2]


async def test_a_closed_connection_is_reopened_for_the_next_request() -> None:
    async with scripted_server(streamed_reply(close=True)) as (url, log):
        connection = Connection(Origin.from_url(url))
        spec = LoadSpec(model="m", output_tokens=2)
        records = [await timed_request(connection, spec, "p") for _ in range(2)]
        await connection.aclose()
    assert [r.error for r in records] == [None, None]
    assert [n for n, *_ in log] == [0, 1]


async def test_a_kept_connection_the_server_closed_while_idle_is_not_reused() -> None:
    closed = trio.Event()

    async def reply_then_close_idle(
        conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, body: bytes
    ) -> bool:
        await streamed_reply()(conn, stream, request, body)
        closed.set()  # as a keep-alive timeout does: no Connection: close was sent
        return False

    async with scripted_server(reply_then_close_idle) as (url, log):
        connection = Connection(Origin.from_url(url))
        spec = LoadSpec(model="m", output_tokens=2)
        first = await timed_request(connection, spec, "p")
        await closed.wait()
        await trio.testing.wait_all_tasks_blocked()  # the server's close is done
        second = await timed_request(connection, spec, "p")
        await connection.aclose()
    assert [first.error, second.error] == [None, None]
    assert [n for n, *_ in log] == [0, 1]


async def test_errors_become_records_not_exceptions() -> None:
    async def not_found(
        conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, body: bytes
    ) -> bool:
        await _send(conn, stream, 404, [b'{"error": {"message": "no such model"}}'])
        return True

    async def cut_off(
        conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, body: bytes
    ) -> bool:
        await stream.send_all(
            conn.send(h11.Response(status_code=200, headers=[("Transfer-Encoding", "chunked")]))
            or b""
        )
        await stream.send_all(conn.send(h11.Data(data=b'data: {"choices":[]}\n\n')) or b"")
        return False  # the connection closes mid-stream

    spec = LoadSpec(model="m", output_tokens=2)
    async with scripted_server(not_found) as (url, _):
        connection = Connection(Origin.from_url(url))
        record = await timed_request(connection, spec, "p")
        await connection.aclose()
    assert (
        record.error is not None
        and record.error.startswith("HTTP 404: ")
        and "no such model" in record.error
    )
    async with scripted_server(cut_off) as (url, _):
        connection = Connection(Origin.from_url(url))
        record = await timed_request(connection, spec, "p")
        await connection.aclose()
    assert record.error is not None and "LoadHTTPError" in record.error
    refused = Connection(Origin.from_url(url))  # that server is gone now
    with pytest.raises(LoadHTTPError, match="connect failed"):
        await refused.request("POST", "/v1/completions", b"{}")


def test_origin_from_url() -> None:
    assert Origin.from_url("https://example.com/api/").port == 443
    assert Origin.from_url("http://[::1]:8000").host_header == "[::1]:8000"
    assert Origin.from_url("http://h:80/v").host_header == "h"
    assert Origin.from_url("http://h:80/v").path_prefix == "/v"
    with pytest.raises(ValueError):
        Origin.from_url("ftp://h")


async def test_health_probe_times_good_answers_and_counts_bad_ones() -> None:
    answers = [200, 503, 200, 200]
    answered = trio.Event()

    async def health(
        conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, body: bytes
    ) -> bool:
        await _send(conn, stream, answers.pop(0) if answers else 200, [b"{}"])
        if not answers:
            answered.set()
        return True

    latencies: list[float] = []
    failures = [0]
    async with scripted_server(health) as (url, log):
        scope = trio.CancelScope()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                _probe_health, Origin.from_url(url), 0.001, latencies, failures, scope
            )
            await answered.wait()
            scope.cancel()
    # The fourth answer may land before or after the cancel; the first three did not.
    assert failures == [1] and len(latencies) >= 2
    assert {target for _, target, _ in log} == {"/health"}
    assert {n for n, *_ in log} == {0}  # one kept-alive connection


def stalled_reply(sent: trio.Event, client_left: trio.Event) -> Reply:
    """Sends the head and one event, then waits for the client to go away."""

    async def reply(
        conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, body: bytes
    ) -> bool:
        if sent.is_set():  # a later request is answered in full
            return await streamed_reply()(conn, stream, request, body)
        headers = [("Content-Type", "text/event-stream"), ("Transfer-Encoding", "chunked")]
        await stream.send_all(conn.send(h11.Response(status_code=200, headers=headers)) or b"")
        await stream.send_all(conn.send(h11.Data(data=sse_body("{}"))) or b"")
        sent.set()
        while await stream.receive_some(65536):
            pass
        client_left.set()
        return False

    return reply


async def test_a_cancelled_request_stops_its_thread_and_the_next_one_reconnects() -> None:
    sent, client_left = trio.Event(), trio.Event()
    spec = LoadSpec(model="m", output_tokens=2)
    async with scripted_server(stalled_reply(sent, client_left)) as (url, log):
        connection = Connection(Origin.from_url(url))
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(timed_request, connection, spec, "p")
                await sent.wait()
                scope.cancel()
        with trio.fail_after(10):  # a guard: the shut-down socket ends the thread's read
            await client_left.wait()
        record = await timed_request(connection, spec, "again")
        await connection.aclose()
    assert record.error is None and record.usage_tokens == 2
    assert [n for n, *_ in log] == [0, 1]  # the second request on a fresh connection


async def test_closing_a_connection_stops_the_read_in_progress() -> None:
    sent, client_left = trio.Event(), trio.Event()
    async with scripted_server(stalled_reply(sent, client_left)) as (url, _):
        connection = Connection(Origin.from_url(url))
        async with trio.open_nursery() as nursery:

            async def request() -> None:
                with pytest.raises(LoadHTTPError):
                    await connection.request("POST", "/v1/completions", b"{}")

            nursery.start_soon(request)
            await sent.wait()
            await connection.aclose()
        with trio.fail_after(10):
            await client_left.wait()


async def test_a_body_that_ends_with_the_connection() -> None:
    async def http10_style(
        conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, body: bytes
    ) -> bool:
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        await stream.send_all(sse_body('{"choices":[{"delta":{"content":"hi"}}]}', "[DONE]"))
        return False  # closing the connection ends the body

    async with scripted_server(http10_style) as (url, _):
        connection = Connection(Origin.from_url(url))
        record = await timed_request(connection, LoadSpec(model="m"), "p")
        await connection.aclose()
    assert record.error is None and len(record.chunk_times) == 1


async def test_a_failed_send_is_an_error_record_and_drops_the_connection() -> None:
    class BrokenSocket:
        """A kept-alive socket whose peer has gone: every send fails."""

        closed = False

        def __init__(self, quiet: socket.socket) -> None:
            self.quiet = quiet  # nothing to read: the peer went away after the check

        def fileno(self) -> int:
            return self.quiet.fileno()

        def sendall(self, data: bytes) -> None:
            raise BrokenPipeError(32, "Broken pipe")

        def shutdown(self, how: int) -> None:
            pass

        def close(self) -> None:
            self.closed = True

    connection = Connection(Origin.from_url("http://127.0.0.1:9"))
    quiet, other = socket.socketpair()
    broken = BrokenSocket(quiet)
    connection._sock = broken  # type: ignore[assignment]
    try:
        record = await timed_request(connection, LoadSpec(model="m"), "p")
    finally:
        quiet.close()
        other.close()
    assert record.error is not None and "send failed" in record.error
    assert broken.closed  # the next request opens a fresh connection
