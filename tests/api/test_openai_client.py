"""The official `openai` client (sync, in worker threads) against the server."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from .conftest import MODEL, in_thread
from .fakes import ScriptedRunner


async def test_chat_and_completion_objects(oai: openai.OpenAI) -> None:
    chat = await in_thread(
        lambda: oai.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_completion_tokens=4,
            n=2,
            logprobs=True,
            top_logprobs=1,
            seed=3,
            temperature=0.5,
        )
    )
    assert [c.index for c in chat.choices] == [0, 1]
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    assert chat.choices[0].finish_reason == "length"
    assert chat.choices[0].logprobs is not None and len(chat.choices[0].logprobs.content or []) == 4
    assert chat.usage is not None and chat.usage.completion_tokens == 8

    comp = await in_thread(
        lambda: oai.completions.create(
            model=MODEL,
            prompt=["a", "b"],
            max_tokens=3,
            logprobs=1,
            stop=["zzz"],
            top_p=0.9,
            extra_body={
                "top_k": 5,
                "min_p": 0.1,
                "repetition_penalty": 1.1,
                "ignore_eos": True,
                "min_tokens": 1,
                "stop_token_ids": [2],
            },
        )
    )
    assert [c.index for c in comp.choices] == [0, 1]
    assert comp.choices[1].logprobs is not None and len(comp.choices[1].logprobs.tokens or []) == 3

    models = await in_thread(lambda: oai.models.list())
    assert [m.id for m in models.data] == [MODEL]


async def test_streaming_with_usage(oai: openai.OpenAI) -> None:
    def run() -> tuple[dict[int, str], Any]:
        texts: dict[int, str] = {}
        usage = None
        for chunk in oai.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            n=3,
            stream=True,
            stream_options={"include_usage": True},
        ):
            for choice in chunk.choices:
                texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            usage = chunk.usage or usage
        return texts, usage

    texts, usage = await in_thread(run)
    assert sorted(texts) == [0, 1, 2] and all(texts.values())
    assert usage.completion_tokens == 15

    def completion_stream() -> dict[int, str]:
        out: dict[int, str] = {}
        for chunk in oai.completions.create(
            model=MODEL, prompt=["x", "y"], max_tokens=4, n=2, stream=True
        ):
            for choice in chunk.choices:
                out[choice.index] = out.get(choice.index, "") + choice.text
        return out

    assert sorted(await in_thread(completion_stream)) == [0, 1, 2, 3]


async def test_client_exceptions(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        await in_thread(
            lambda: oai.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], temperature=-1
            )
        )
    assert bad.value.body["param"] == "temperature"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        await in_thread(
            lambda: oai.chat.completions.create(
                model="missing", messages=[{"role": "user", "content": "hi"}]
            )
        )


async def test_stream_error_raises_in_client(start_server: Any, runner: ScriptedRunner) -> None:
    runner.fail_next = True
    async with start_server() as server:
        with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=30) as oai:

            def run() -> None:
                for _ in oai.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "hi"}],
                    stream=True,
                    max_tokens=5,
                ):
                    pass

            with pytest.raises(openai.APIError, match="engine"):
                await in_thread(run)
            with pytest.raises(openai.InternalServerError):  # 503 afterwards
                await in_thread(run)
