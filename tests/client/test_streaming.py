"""Streams over a real socket: SSE edge cases, no retry once started, disconnects."""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing
from client_fakes import Conn, FakeServer, Request, chat_chunk, completion_chunk

from sluiceway.client import (
    APIStreamError,
    APITimeoutError,
    RateLimitedError,
    ResponseFormatError,
    StreamInterruptedError,
)
from sluiceway.protocol import ChatCompletionChunk, CompletionChunk

MESSAGES = [{"role": "user", "content": "Hi"}]


async def collect(server: FakeServer, **kwargs: object) -> list[ChatCompletionChunk]:
    async with server.client(**kwargs) as client:  # type: ignore[arg-type]
        async with await client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True
        ) as stream:
            return [chunk async for chunk in stream]


def texts(chunks: list[ChatCompletionChunk]) -> str:
    return "".join(c.choices[0].text for c in chunks if c.choices)


@pytest.mark.parametrize("chunked", [True, False])
async def test_stream_yields_typed_chunks_until_done(server: FakeServer, chunked: bool) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.start_sse(chunked=chunked)
        await conn.send_event(chat_chunk(0, "", role="assistant"))
        await conn.send_event(chat_chunk(0, "Hel"))
        await conn.send_event(chat_chunk(0, "lo", finish="stop"))
        await conn.send_done()

    server.handler = handler
    chunks = await collect(server)
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert texts(chunks) == "Hello"
    assert chunks[-1].choices[0].finish_reason == "stop"
    req = server.requests[0]
    assert req.json()["stream"] is True
    assert req.headers["accept"] == "text/event-stream"


async def test_completions_stream(server: FakeServer) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.start_sse()
        await conn.send_event(completion_chunk(0, "a"))
        await conn.send_event(completion_chunk(0, "b", finish="length"))
        await conn.send_done()

    server.handler = handler
    async with server.client() as client:
        async with client.completions.stream(model="m", prompt="x") as stream:
            chunks = [c async for c in stream]
            assert stream.completed
    assert all(isinstance(c, CompletionChunk) for c in chunks)
    assert "".join(c.choices[0].text for c in chunks) == "ab"


async def test_comments_heartbeats_crlf_and_multiline_data(server: FakeServer) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.start_sse()
        await conn.send_raw(": heartbeat\n\n")
        await conn.send_raw(":\n\n")
        await conn.send_raw("retry: 1000\n\n")  # an event with no data: skipped
        data = json.dumps(chat_chunk(0, "one"), indent=1)  # a multi-line JSON document
        await conn.send_raw("".join(f"data: {line}\n" for line in data.splitlines()) + "\n")
        await conn.send_raw(": ping\r\n\r\n")
        await conn.send_raw(f"data: {json.dumps(chat_chunk(0, ' two'))}\r\n\r\n")
        await conn.send_raw(
            "event: message\nid: 7\ndata: " + json.dumps(chat_chunk(0, "!")) + "\n\n"
        )
        await conn.send_done()

    server.handler = handler
    assert texts(await collect(server)) == "one two!"


async def test_event_split_across_network_reads(server: FakeServer) -> None:
    event = f"data: {json.dumps(chat_chunk(0, 'snow ☃ man'), ensure_ascii=False)}\n\n".encode()
    cut = event.index("☃".encode()) + 1  # inside the UTF-8 bytes of the snowman

    async def handler(req: Request, conn: Conn) -> None:
        await conn.start_sse(chunked=False)
        for piece in (event[:5], event[5:cut], event[cut:-1], event[-1:]):
            await conn.send_raw(piece)
            # The client has read this piece and is waiting for the rest.
            await trio.testing.wait_all_tasks_blocked()
        await conn.send_done()
        await conn.stream.send_eof()

    server.handler = handler
    assert texts(await collect(server)) == "snow ☃ man"


async def test_event_split_across_http_chunks(server: FakeServer) -> None:
    event = f"data: {json.dumps(chat_chunk(0, 'abc'))}\n\n"

    async def handler(req: Request, conn: Conn) -> None:
        await conn.start_sse()
        await conn.send_raw(event[:10])
        await trio.testing.wait_all_tasks_blocked()
        await conn.send_raw(event[10:] + "data: [DO")
        await trio.testing.wait_all_tasks_blocked()
        await conn.send_raw("NE]\n\n")
        await conn.end()

    server.handler = handler
    assert texts(await collect(server)) == "abc"


async def test_stream_ending_cleanly_without_done_raises(server: FakeServer) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.start_sse()
        await conn.send_event(chat_chunk(0, "partial"))
        await conn.end()

    server.handler = handler
    got = []
    with pytest.raises(StreamInterruptedError, match=r"\[DONE\]"):
        async with server.client() as client:
            async with client.chat.completions.stream(model="m", messages=MESSAGES) as stream:
                async for chunk in stream:
                    got.append(chunk)
    assert texts(got) == "partial"


async def test_connection_cut_mid_stream_raises_and_is_not_retried(server: FakeServer) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.start_sse()
        await conn.send_event(chat_chunk(0, "partial"))
        await conn.stream.aclose()  # mid-body: no terminating chunk

    server.handler = handler
    with pytest.raises(StreamInterruptedError, match="incomplete"):
        await collect(server, max_retries=5)
    assert len(server.requests) == 1


async def test_error_event_inside_stream(server: FakeServer) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.start_sse()
        await conn.send_event(chat_chunk(0, "a"))
        await conn.send_event(
            {
                "error": {
                    "message": "engine died",
                    "type": "internal_error",
                    "param": None,
                    "code": 500,
                }
            }
        )
        await conn.send_done()

    server.handler = handler
    with pytest.raises(APIStreamError) as info:
        await collect(server)
    assert info.value.error.message == "engine died"
    assert info.value.error.code == 500


async def test_malformed_event_is_a_format_error(server: FakeServer) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.start_sse()
        await conn.send_raw("data: {not json\n\n")
        await conn.wait_disconnect()

    server.handler = handler
    with pytest.raises(ResponseFormatError):
        await collect(server)


async def test_non_sse_success_is_a_format_error(server: FakeServer) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.send_json(200, {"id": "x"})

    server.handler = handler
    with pytest.raises(ResponseFormatError, match="text/event-stream"):
        await collect(server)


async def test_refused_stream_is_retried_before_it_starts(
    server: FakeServer, autojump_clock: trio.testing.MockClock
) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        if len(server.requests) == 1:
            await conn.send_error(429, "busy", "rate_limit_error", headers={"Retry-After": "2"})
            return
        await conn.start_sse()
        await conn.send_event(chat_chunk(0, "ok", finish="stop"))
        await conn.send_done()

    server.handler = handler
    assert texts(await collect(server)) == "ok"
    assert server.requests[1].time - server.requests[0].time == pytest.approx(2.0)


async def test_refused_stream_raises_typed_error_on_enter(server: FakeServer) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.send_error(429, "busy", "rate_limit_error", headers={"Retry-After": "999"})

    server.handler = handler
    async with server.client() as client:
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        assert server.requests == []  # nothing is sent before the block is entered
        with pytest.raises(RateLimitedError):
            async with stream:
                pass


async def test_iterating_without_entering_is_refused(server: FakeServer) -> None:
    async with server.client() as client:
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        with pytest.raises(RuntimeError, match="async with"):
            async for _ in stream:
                pass


async def endless(req: Request, conn: Conn) -> None:
    """One chunk, then wait until the client goes away (the server's abort)."""
    await conn.start_sse()
    await conn.send_event(chat_chunk(0, "first"))
    await conn.wait_disconnect()


async def test_break_closes_the_connection(server: FakeServer) -> None:
    server.handler = endless
    async with server.client() as client:
        async with client.chat.completions.stream(model="m", messages=MESSAGES) as stream:
            async for chunk in stream:
                assert chunk.choices[0].text == "first"
                break
        # Closed before the block exited; the server sees it without any sleep.
        with trio.fail_after(5):
            await server.disconnected.wait()


async def test_exception_in_block_closes_the_connection(server: FakeServer) -> None:
    server.handler = endless
    async with server.client() as client:
        with pytest.raises(KeyError):
            async with client.chat.completions.stream(model="m", messages=MESSAGES) as stream:
                async for _ in stream:
                    raise KeyError("consumer bug")
        with trio.fail_after(5):
            await server.disconnected.wait()


async def test_cancellation_closes_the_connection(server: FakeServer) -> None:
    server.handler = endless
    got = []
    async with server.client() as client:
        with trio.CancelScope() as scope:
            async with client.chat.completions.stream(model="m", messages=MESSAGES) as stream:
                async for chunk in stream:
                    got.append(chunk)
                    scope.cancel()  # e.g. the user pressed Ctrl-C
        assert scope.cancelled_caught
        with trio.fail_after(5):
            await server.disconnected.wait()
    assert texts(got) == "first"


async def test_idle_stream_times_out_and_closes(
    server: FakeServer, autojump_clock: trio.testing.MockClock
) -> None:
    server.handler = endless
    start = trio.current_time()
    got = []
    with pytest.raises(APITimeoutError, match="next stream event"):
        async with server.client(timeout=20) as client:
            async with client.chat.completions.stream(model="m", messages=MESSAGES) as stream:
                async for chunk in stream:
                    got.append(chunk)
    assert trio.current_time() - start == pytest.approx(20)
    await server.disconnected.wait()
    assert texts(got) == "first"


async def test_long_stream_is_not_cut_by_the_timeout(
    server: FakeServer, autojump_clock: trio.testing.MockClock
) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.start_sse()
        for _ in range(10):
            await trio.sleep(4)  # 40 s in all, each gap under the 5 s idle limit
            await conn.send_event(chat_chunk(0, "x"))
        await conn.send_done()

    server.handler = handler
    assert texts(await collect(server, timeout=5)) == "x" * 10
