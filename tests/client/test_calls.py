"""Non-streamed calls, typed errors and retries against the fake server."""

from __future__ import annotations

import itertools

import pytest
import trio
from client_fakes import Conn, FakeServer, Request, chat_completion, completion

from sluiceway.client import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AsyncClient,
    AuthenticationError,
    BadRequestError,
    InternalServerError,
    NotFoundError,
    PayloadTooLargeError,
    RateLimitedError,
    ResponseFormatError,
    ServerUnavailableError,
)
from sluiceway.protocol import ChatCompletion, Completion, ErrorObject, ModelList

MESSAGES = [{"role": "user", "content": "Hi"}]


async def test_chat_create_sends_openai_request_and_returns_typed_result(
    server: FakeServer,
) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.send_json(200, chat_completion("hello there"))

    server.handler = handler
    async with server.client(api_key="sk-test") as client:
        reply = await client.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=5, temperature=None
        )
    assert isinstance(reply, ChatCompletion)
    assert reply.choices[0].message.content == "hello there"
    assert reply.usage is not None and reply.usage.total_tokens == 4
    (req,) = server.requests
    assert (req.method, req.path) == ("POST", "/v1/chat/completions")
    assert req.headers["authorization"] == "Bearer sk-test"
    assert req.json() == {"model": "m", "messages": MESSAGES, "max_tokens": 5}


async def test_base_url_with_v1_suffix_is_accepted(server: FakeServer) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.send_json(200, {"object": "list", "data": [{"id": "m", "object": "model"}]})

    server.handler = handler
    async with AsyncClient(server.url + "/v1/") as client:
        models = await client.models.list()
    assert isinstance(models, ModelList) and [m.id for m in models.data] == ["m"]
    assert server.requests[0].path == "/v1/models"


async def test_completions_and_tokenize(server: FakeServer) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        if req.path == "/tokenize":
            await conn.send_json(200, {"tokens": [1, 2, 3], "count": 3, "max_model_len": 8192})
        else:
            await conn.send_json(200, completion("world"))

    server.handler = handler
    async with server.client(default_model="dm") as client:
        done = await client.completions.create(prompt=["a", "b"], n=2)
        tokens = await client.tokenize("hello")
    assert isinstance(done, Completion) and done.choices[0].text == "world"
    assert server.requests[0].json() == {"model": "dm", "prompt": ["a", "b"], "n": 2}
    assert tokens.tokens == [1, 2, 3] and tokens.count == 3 and tokens.max_model_len == 8192
    assert server.requests[1].json() == {"model": "dm", "prompt": "hello"}


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, BadRequestError),
        (401, AuthenticationError),
        (404, NotFoundError),
        (413, PayloadTooLargeError),
        (500, InternalServerError),
        (418, APIStatusError),
    ],
)
async def test_http_errors_become_typed_exceptions_with_the_error_object(
    server: FakeServer, status: int, cls: type[APIStatusError]
) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.send_error(status, "nope", "invalid_request_error", "messages", "bad_thing")

    server.handler = handler
    async with server.client() as client:
        with pytest.raises(cls) as info:
            await client.chat.completions.create(model="m", messages=MESSAGES)
    assert type(info.value) is cls
    assert info.value.status_code == status
    assert info.value.error == ErrorObject("nope", "invalid_request_error", "messages", "bad_thing")
    assert len(server.requests) == 1  # not retried


async def test_error_without_json_body_still_typed(server: FakeServer) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.send_head(404, {"Content-Length": "9"})
        await conn.stream.send_all(b"not found")

    server.handler = handler
    async with server.client() as client:
        with pytest.raises(NotFoundError) as info:
            await client.models.list()
    assert info.value.error.message == "not found"


async def test_non_json_success_body_is_a_format_error(server: FakeServer) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.send_head(200, {"Content-Length": "3"})
        await conn.stream.send_all(b"hi!")

    server.handler = handler
    async with server.client() as client:
        with pytest.raises(ResponseFormatError):
            await client.models.list()


async def test_429_retried_after_retry_after_then_success(
    server: FakeServer, autojump_clock: trio.testing.MockClock
) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        if len(server.requests) == 1:
            await conn.send_error(
                429, "slow down", "rate_limit_error", headers={"Retry-After": "7"}
            )
        else:
            await conn.send_json(200, chat_completion("ok"))

    server.handler = handler
    async with server.client() as client:
        reply = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert reply.choices[0].message.content == "ok"
    first, second = server.requests
    # Retry-After (7 s) is honoured, not the much shorter default backoff.
    assert 7.0 <= second.time - first.time < 7.5


async def test_503_retried_with_exponential_backoff_then_gives_up(
    server: FakeServer, autojump_clock: trio.testing.MockClock
) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.send_error(503, "draining", "server_unavailable")

    server.handler = handler
    async with server.client(max_retries=3) as client:
        with pytest.raises(ServerUnavailableError) as info:
            await client.completions.create(model="m", prompt="x")
    assert info.value.error.message == "draining"
    times = [r.time for r in server.requests]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(times) == 4  # 1 + max_retries
    # base 0.5 s doubling, jitter takes off at most half
    for gap, backoff in zip(gaps, [0.5, 1.0, 2.0], strict=True):
        assert backoff * 0.5 <= gap <= backoff + 0.01


async def test_503_then_success(server: FakeServer, autojump_clock: trio.testing.MockClock) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        if len(server.requests) < 3:
            await conn.send_error(503, "busy", "server_unavailable", headers={"Retry-After": "1"})
        else:
            await conn.send_json(200, chat_completion("finally"))

    server.handler = handler
    async with server.client() as client:
        reply = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert reply.choices[0].message.content == "finally"
    assert len(server.requests) == 3


async def test_retry_after_longer_than_the_cap_is_not_waited_for(
    server: FakeServer, autojump_clock: trio.testing.MockClock
) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.send_error(
            429, "come back tomorrow", "rate_limit_error", headers={"Retry-After": "86400"}
        )

    server.handler = handler
    async with server.client() as client:
        with pytest.raises(RateLimitedError) as info:
            await client.chat.completions.create(model="m", messages=MESSAGES)
    assert info.value.retry_after == 86400.0
    assert len(server.requests) == 1


async def test_deadline_covers_retries_and_is_a_trio_cancel_scope(
    server: FakeServer, autojump_clock: trio.testing.MockClock
) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.send_error(429, "slow down", "rate_limit_error", headers={"Retry-After": "30"})

    server.handler = handler
    start = trio.current_time()
    async with server.client(timeout=10) as client:
        with pytest.raises(APITimeoutError) as info:
            await client.chat.completions.create(model="m", messages=MESSAGES)
    assert isinstance(info.value, trio.TooSlowError)
    assert trio.current_time() - start == pytest.approx(10)
    assert len(server.requests) == 1


async def test_hanging_server_times_out(
    server: FakeServer, autojump_clock: trio.testing.MockClock
) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.wait_disconnect()

    server.handler = handler
    async with server.client() as client:
        with pytest.raises(APITimeoutError):
            await client.models.list(timeout=3)
    await server.disconnected.wait()  # the timed-out request's connection was closed


async def test_connection_refused_is_a_connection_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there now
    async with AsyncClient(f"http://127.0.0.1:{port}", max_retries=1) as client:
        with pytest.raises(APIConnectionError):
            await client.models.list()
