"""stream_choices (one consumer per choice) and run_many (many requests at once)."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from client_fakes import Conn, FakeServer, Request, chat_chunk, chat_completion, completion_chunk

from sluiceway.client import (
    APITimeoutError,
    BadRequestError,
    ChatCall,
    ChoiceStream,
    CompletionCall,
    StreamInterruptedError,
)
from sluiceway.client._fanout import count_prompts
from sluiceway.protocol import ChatCompletion, Completion, Usage

CONVERSATIONS = [[{"role": "user", "content": f"q{i}"}] for i in range(2)]


def test_count_prompts() -> None:
    assert count_prompts(CONVERSATIONS, None) == 2
    assert count_prompts(CONVERSATIONS[0], None) == 1
    assert count_prompts(None, "a") == 1
    assert count_prompts(None, ["a", "b", "c"]) == 3
    assert count_prompts(None, [1, 2, 3]) == 1
    assert count_prompts(None, [[1, 2], [3]]) == 2


async def test_batch_chat_n2_interleaved_one_consumer_per_choice(server: FakeServer) -> None:
    # 2 conversations x n=2 = 4 choices; index = prompt_index * n + j. Choice 0
    # finishes first; the others must keep streaming (the seed's hang).
    script = [
        (0, "A"),
        (2, "C"),
        (1, "B"),
        (0, None),
        (3, "D"),
        (2, "c"),
        (1, "b"),
        (3, "d"),
        (2, None),
        (1, None),
        (3, None),
    ]

    async def handler(req: Request, conn: Conn) -> None:
        await conn.start_sse()
        for index, text in script:
            if text is None:
                await conn.send_event(chat_chunk(index, "", finish="stop"))
            else:
                await conn.send_event(chat_chunk(index, text))
        await conn.send_event(
            {
                "id": "x",
                "object": "chat.completion.chunk",
                "model": "m",
                "choices": [],
                "usage": {"prompt_tokens": 4, "completion_tokens": 8, "total_tokens": 12},
            }
        )
        await conn.send_done()

    server.handler = handler
    results: dict[int, str] = {}
    all_other_done = trio.Event()
    finished: set[int] = set()

    async def consume(choice: ChoiceStream) -> None:
        if choice.index == 0:
            # A consumer that reads nothing until all the others are done: it
            # must not hold them up.
            await all_other_done.wait()
        text = ""
        async for event in choice:
            assert event.index == choice.index
            text += event.text
        results[choice.index] = text
        finished.add(choice.index)
        if finished == {1, 2, 3}:
            all_other_done.set()

    async with server.client() as client:
        async with client.stream_choices(model="m", messages=CONVERSATIONS, n=2) as choices:
            assert len(choices) == 4
            assert [c.prompt_index for c in choices] == [0, 0, 1, 1]
            assert choices.for_prompt(1) == [choices[2], choices[3]]
            async with trio.open_nursery() as nursery:
                for choice in choices:
                    nursery.start_soon(consume, choice)
        assert choices.usage == Usage(4, 8, 12)
        assert choices.texts() == ["A", "Bb", "Cc", "Dd"]
        assert [c.finish_reason for c in choices] == ["stop"] * 4
    assert results == {0: "A", 1: "Bb", 2: "Cc", 3: "Dd"}
    body = server.requests[0].json()
    assert body["n"] == 2 and body["messages"] == CONVERSATIONS and body["stream"] is True


async def test_batch_prompts_collect(server: FakeServer) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.start_sse()
        await conn.send_event(completion_chunk(1, "y"))
        await conn.send_event(completion_chunk(0, "x"))
        await conn.send_event(completion_chunk(2, "z", finish="length"))
        await conn.send_event(completion_chunk(0, "x", finish="length"))
        await conn.send_event(completion_chunk(1, "y", finish="stop"))
        await conn.send_done()

    server.handler = handler
    texts: list[str] = ["", "", ""]

    async def consume(choice: ChoiceStream) -> None:
        texts[choice.index] = await choice.collect()

    async with server.client() as client:
        async with client.stream_choices(model="m", prompt=["a", "b", "c"]) as choices:
            async with trio.open_nursery() as nursery:
                for choice in choices:
                    nursery.start_soon(consume, choice)
    assert texts == ["xx", "yy", "z"]
    assert "n" not in server.requests[0].json()


async def test_cut_stream_errors_only_the_unfinished_choices(server: FakeServer) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.start_sse()
        await conn.send_event(chat_chunk(0, "done", finish="stop"))
        await conn.send_event(chat_chunk(1, "half"))
        await conn.stream.aclose()

    server.handler = handler
    outcome: dict[int, object] = {}

    async def consume(choice: ChoiceStream) -> None:
        try:
            outcome[choice.index] = await choice.collect()
        except StreamInterruptedError as exc:
            outcome[choice.index] = exc

    async with server.client() as client:
        async with client.stream_choices(model="m", messages=CONVERSATIONS) as choices:
            async with trio.open_nursery() as nursery:
                for choice in choices:
                    nursery.start_soon(consume, choice)
        assert isinstance(choices.error, StreamInterruptedError)
    assert outcome[0] == "done"
    assert isinstance(outcome[1], StreamInterruptedError)
    assert choices[1].text == "half"


async def test_done_without_finish_reason_is_an_interruption(server: FakeServer) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.start_sse()
        await conn.send_event(chat_chunk(0, "x", finish="stop"))
        await conn.send_done()

    server.handler = handler
    async with server.client() as client:
        async with client.stream_choices(model="m", messages=CONVERSATIONS) as choices:
            assert await choices[0].collect() == "x"
            with pytest.raises(StreamInterruptedError, match=r"\[1\]"):
                await choices[1].collect()


async def test_leaving_stream_choices_early_closes_the_connection(server: FakeServer) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.start_sse()
        await conn.send_event(chat_chunk(0, "a"))
        await conn.wait_disconnect()

    server.handler = handler
    async with server.client() as client:
        async with client.stream_choices(model="m", messages=CONVERSATIONS) as choices:
            async for event in choices[0]:
                assert event.text == "a"
                break
        with trio.fail_after(5):
            await server.disconnected.wait()


async def test_caller_exception_comes_out_unwrapped(server: FakeServer) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.start_sse()
        await conn.wait_disconnect()

    server.handler = handler
    async with server.client() as client:
        with pytest.raises(ZeroDivisionError):
            async with client.stream_choices(model="m", messages=CONVERSATIONS):
                1 / 0  # noqa: B018
        with trio.fail_after(5):
            await server.disconnected.wait()


async def test_refused_stream_choices_raises_on_enter(server: FakeServer) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.send_error(400, "too many conversations", param="messages")

    server.handler = handler
    async with server.client() as client:
        with pytest.raises(BadRequestError, match="too many"):
            async with client.stream_choices(model="m", messages=CONVERSATIONS):
                pytest.fail("not reached")


# ------------------------------------------------------------------------ run_many


async def test_run_many_order_isolation_and_concurrency_limit(
    server: FakeServer, autojump_clock: trio.testing.MockClock
) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        body = req.json()
        key = body.get("prompt") or body["messages"][0]["content"]
        i = int(key[1:])
        await trio.sleep(10 - i)  # later requests finish first
        if i == 3:
            await conn.send_error(400, "bad request 3", param="messages")
        elif "prompt" in body:
            await conn.send_json(
                200,
                {
                    "id": "c",
                    "object": "text_completion",
                    "model": "m",
                    "choices": [{"index": 0, "text": key}],
                },
            )
        else:
            await conn.send_json(200, chat_completion(key))

    server.handler = handler
    requests = [
        ChatCall([{"role": "user", "content": "q0"}], "m"),
        {"model": "m", "messages": [{"role": "user", "content": "q1"}], "max_tokens": 3},
        CompletionCall("q2", "m"),
        {"model": "m", "messages": [{"role": "user", "content": "q3"}]},
        {"model": "m", "prompt": "q4"},
        ChatCall([{"role": "user", "content": "q5"}], "m", {"temperature": 0.0}),
    ]
    async with server.client() as client:
        results = await client.run_many(requests, max_concurrency=2)
    assert server.max_in_flight == 2
    assert isinstance(results[0], ChatCompletion) and results[0].choices[0].message.content == "q0"
    assert isinstance(results[1], ChatCompletion) and results[1].choices[0].message.content == "q1"
    assert isinstance(results[2], Completion) and results[2].choices[0].text == "q2"
    assert isinstance(results[3], BadRequestError)
    assert results[3].error.message == "bad request 3" and results[3].error.param == "messages"
    assert isinstance(results[4], Completion) and results[4].choices[0].text == "q4"
    assert isinstance(results[5], ChatCompletion)
    sent = {
        r.json().get("prompt") or r.json()["messages"][0]["content"]: r.json()
        for r in server.requests
    }
    assert sent["q1"]["max_tokens"] == 3 and sent["q5"]["temperature"] == 0.0


async def test_run_many_each_request_has_its_own_deadline(
    server: FakeServer, autojump_clock: trio.testing.MockClock
) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        if req.json()["prompt"] == "slow":
            await conn.wait_disconnect()
        else:
            await trio.sleep(5)
            await conn.send_json(200, {"id": "c", "model": "m", "choices": [{"text": "ok"}]})

    server.handler = handler
    async with server.client() as client:
        results = await client.run_many(
            [
                {"model": "m", "prompt": "slow", "timeout": 2},
                {"model": "m", "prompt": "fast", "timeout": 30},
            ]
        )
    assert isinstance(results[0], APITimeoutError)
    assert isinstance(results[1], Completion) and results[1].choices[0].text == "ok"


async def test_run_many_fail_fast_cancels_the_rest(
    server: FakeServer, autojump_clock: trio.testing.MockClock
) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        if req.json()["prompt"] == "bad":
            await conn.send_error(400, "bad prompt")
        else:
            await conn.wait_disconnect()

    server.handler = handler
    start = trio.current_time()
    async with server.client() as client:
        with pytest.raises(BadRequestError, match="bad prompt"):
            await client.run_many(
                [{"model": "m", "prompt": "hang"}, {"model": "m", "prompt": "bad"}],
                fail_fast=True,
            )
    assert trio.current_time() - start < 1
    with trio.fail_after(5):
        await server.disconnected.wait()  # the hanging request was cancelled and closed


def test_run_many_rejects_streaming_and_shapeless_requests() -> None:
    from sluiceway.client._fanout import _as_request

    with pytest.raises(ValueError, match="stream_choices"):
        _as_request({"model": "m", "prompt": "x", "stream": True})
    with pytest.raises(ValueError, match="messages= or prompt="):
        _as_request({"model": "m"})
