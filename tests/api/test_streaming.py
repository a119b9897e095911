"""The seed bug and its relatives: parallel and batched streams all start and all finish."""

from __future__ import annotations

from contextlib import aclosing
from typing import Any

import httpx
import openai
import trio

from server_helpers import StreamResult, chat, parse_event, stream
from sluiceway.api.serve import RunningServer
from sluiceway.config import EngineConfig

from .conftest import MODEL
from .fakes import ScriptedRunner

QUESTIONS = [
    "Explain quantum computing.",
    "Write hello world in Python.",
    "What is the capital of France?",
]


def _openai(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)


async def test_seed_parallel_streams_and_batch_chat(server: RunningServer) -> None:
    await _seed_parallel_streams_and_batch_chat(server)


async def test_seed_load_with_steps_on_the_event_loop(start_server: Any) -> None:
    """The same load when every step runs on the event loop's own thread, which then
    serves nothing while a step runs: every stream still starts and finishes."""
    async with start_server(engine_config=EngineConfig(steps_on_event_loop=True)) as server:
        await _seed_parallel_streams_and_batch_chat(server)


async def _seed_parallel_streams_and_batch_chat(server: RunningServer) -> None:
    """16 parallel streaming chats plus the seed's batch-chat request, via the official
    client, closed at the end (its sockets never reach a later test)."""
    with _openai(server) as client:
        await _seed_load(client)


async def _seed_load(client: openai.OpenAI) -> None:

    def one_stream(i: int) -> tuple[str, str | None]:
        text, finish = "", None
        for chunk in client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"question {i}"}],
            stream=True,
            max_tokens=12,
        ):
            assert len(chunk.choices) == 1 and chunk.choices[0].index == 0
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        return text, finish

    def batch_chat() -> dict[int, tuple[str, str | None]]:
        results: dict[int, tuple[str, str | None]] = {}
        response = client.chat.completions.create(
            model=MODEL,
            messages=[[{"role": "user", "content": q}] for q in QUESTIONS],  # type: ignore[misc]
            stream=True,
            max_tokens=10,
        )
        for chunk in response:
            for choice in chunk.choices:
                text, finish = results.get(choice.index, ("", None))
                results[choice.index] = (
                    text + (choice.delta.content or ""),
                    choice.finish_reason or finish,
                )
        return results

    outcomes: dict[Any, Any] = {}

    async def run(key: Any, fn: Any, *args: Any) -> None:
        outcomes[key] = await trio.to_thread.run_sync(fn, *args)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for i in range(16):
                nursery.start_soon(run, i, one_stream, i)
            nursery.start_soon(run, "batch", batch_chat)

    for i in range(16):
        text, finish = outcomes[i]
        assert finish == "length" and text, (i, outcomes[i])
    batch = outcomes["batch"]
    assert sorted(batch) == [0, 1, 2]
    assert all(finish == "length" for _, finish in batch.values())

    # Every conversation's answer equals the answer it gets alone.
    for index, question in enumerate(QUESTIONS):
        alone = await trio.to_thread.run_sync(
            lambda q=question: client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": q}], max_tokens=10
            )
        )
        assert alone.choices[0].message.content == batch[index][0]


async def test_n4_streaming_every_index_finishes(client: httpx.AsyncClient) -> None:
    result = await stream(client, "/v1/chat/completions", chat("hello", n=4, max_tokens=6))
    result.check_well_formed()
    assert sorted(result.by_index()) == [0, 1, 2, 3]
    assert set(result.finish_reasons().values()) == {"length"}
    assert len(set(result.texts().values())) == 1  # the fake runner is deterministic


async def test_batch_prompts_with_n2(client: httpx.AsyncClient) -> None:
    tokens = (await client.post("/tokenize", json={"prompt": "a token prompt"})).json()["tokens"]
    prompts: list[Any] = ["first prompt", "second, longer prompt", tokens]
    body = {"model": MODEL, "prompt": prompts, "n": 2, "max_tokens": 7}
    result = await stream(client, "/v1/completions", body)
    result.check_well_formed()
    texts = result.texts()
    assert sorted(texts) == list(range(6))
    assert set(result.finish_reasons().values()) == {"length"}
    # index = prompt_index * n + j; each prompt's answer equals its answer alone
    for p, prompt in enumerate(prompts):
        alone = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 7}
        )
        assert texts[2 * p] == texts[2 * p + 1] == alone.json()["choices"][0]["text"]
    non_stream = (await client.post("/v1/completions", json=body)).json()
    assert [c["index"] for c in non_stream["choices"]] == list(range(6))
    assert non_stream["usage"]["completion_tokens"] == 42


async def test_usage_chunk_and_continuous_usage(client: httpx.AsyncClient) -> None:
    body = chat("count", n=2, max_tokens=5, stream_options={"include_usage": True})
    result = await stream(client, "/v1/chat/completions", body)
    result.check_well_formed()
    last = result.chunks[-1]
    assert last["choices"] == []
    prompt_tokens = last["usage"]["prompt_tokens"]
    assert last["usage"]["completion_tokens"] == 10
    assert last["usage"]["total_tokens"] == prompt_tokens + 10
    assert all(c["usage"] is None for c in result.chunks[:-1])

    body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    result = await stream(client, "/v1/chat/completions", body)
    final_chunks = [c for c in result.chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert all(c["usage"]["completion_tokens"] == 5 for c in final_chunks)


async def test_choices_stream_independently(start_server: Any, runner: ScriptedRunner) -> None:
    """With the model held to one step at a time, every choice's first token reaches
    the client before the engine may take a second step: nothing is serialized."""
    runner.gated = True
    async with (
        start_server() as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        body = {
            "model": MODEL,
            "prompt": ["one", "two", "three"],
            "n": 2,
            "max_tokens": 4,
            "stream": True,
        }
        result = StreamResult(200)
        with trio.fail_after(20):
            async with (
                client.stream("POST", "/v1/completions", json=body) as response,
                aclosing(response.aiter_lines()) as lines,
            ):
                runner.allow(1)  # one step: the prefill of every prompt, first token of each choice
                while (
                    len({i for i, cs in result.by_index().items() if any(c["text"] for c in cs)})
                    < 6
                ):
                    parse_event(await lines.__anext__(), result)
                runner.open()
                async for line in lines:
                    parse_event(line, result)
        result.check_well_formed()
        assert sorted(result.finish_reasons()) == list(range(6))


async def test_logprobs_formats(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/chat/completions", json=chat("x", max_tokens=3, logprobs=True, top_logprobs=2)
    )
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 3
    assert set(content[0]) == {"token", "logprob", "bytes", "top_logprobs"}
    assert len(content[0]["top_logprobs"]) == 2 and content[0]["logprob"] == -0.25
    r = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3, "logprobs": 2})
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 3
    assert lp["text_offset"][0] == 0 and lp["text_offset"][1] == len(lp["tokens"][0])
    result = await stream(client, "/v1/chat/completions", chat("x", max_tokens=3, logprobs=True))
    assert sum(len(c["logprobs"]["content"]) for c in result.by_index()[0] if c["logprobs"]) == 3


async def test_echo_and_stop(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/completions", json={"prompt": "Say:", "max_tokens": 4, "echo": True})
    text = r.json()["choices"][0]["text"]
    assert text.startswith("Say:") and len(text) > len("Say:")
    full = (await client.post("/v1/completions", json={"prompt": "Say:", "max_tokens": 8})).json()
    words = full["choices"][0]["text"].split()
    stopped = (
        await client.post(
            "/v1/completions", json={"prompt": "Say:", "max_tokens": 8, "stop": [words[2]]}
        )
    ).json()
    choice = stopped["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == words[2]
    assert words[2] not in choice["text"].split()[2:] and len(choice["text"]) < len(
        full["choices"][0]["text"]
    )


async def test_stream_interval_sends_fewer_events_with_the_same_text(
    start_server: Any, client: httpx.AsyncClient
) -> None:
    body = chat("count", max_tokens=7, logprobs=True, stream_options={"include_usage": True})
    every_token = await stream(client, "/v1/chat/completions", body)
    async with (
        start_server(engine_config=EngineConfig(stream_interval=3)) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as joined_client,
    ):
        joined = await stream(joined_client, "/v1/chat/completions", body)
    joined.check_well_formed()

    def tokens_per_event(result: StreamResult) -> list[int]:
        return [len(c["logprobs"]["content"]) for c in result.by_index()[0] if c["logprobs"]]

    # One token per event against the first token alone, then three at a time.
    assert tokens_per_event(every_token) == [1] * 7
    assert tokens_per_event(joined) == [1, 3, 3]
    assert joined.texts() == every_token.texts() and joined.texts()[0]
    assert joined.usage() == every_token.usage()
    assert joined.finish_reasons() == every_token.finish_reasons() == {0: "length"}
