"""Fixtures: the real SmolLM2 tokenizer (loaded once), a scripted runner, and a real
server on an ephemeral loopback port inside the test's nursery."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import httpx
import openai
import pytest
import trio

import server_helpers
from sluiceway.api.serve import RunningServer
from tiny_models import TINY_LLAMA
from wire_roundtrip import Recorder

from .fakes import ScriptedRunner

MODEL = "test-model"  # the name tests/conftest.py serves under
T = TypeVar("T")


def record_finished_lines(
    store: Any, answered: list[str], done: trio.Event | None = None, count: int = 0
) -> None:
    """Make the batch `store` add the `custom_id` of each line it finishes to
    `answered`, and set `done` once `count` are there (a restart test stops the
    server at a known line)."""
    finish = store.finish_line

    def finish_line(batch_id: str, line: int, status: Any, result: str) -> None:
        answered.append(json.loads(result)["custom_id"])
        finish(batch_id, line, status, result)
        if done is not None and len(answered) == count:
            done.set()

    store.finish_line = finish_line


async def in_thread(fn: Callable[[], T]) -> T:
    """`fn()` in a worker thread (the sync `openai` client), within 30 s."""
    with trio.fail_after(30):
        return await trio.to_thread.run_sync(fn)


@pytest.fixture(scope="package")
def tiny_runner_parts(tokenizer: Any) -> tuple[Any, dict[str, Any]]:
    """A tiny random-weight Llama over the SmolLM2 tokenizer's vocabulary: its
    config and state dict, for servers on the real torch runner."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        **TINY_LLAMA,
        vocab_size=len(tokenizer),
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config).eval()
    return config, model.state_dict()


@pytest.fixture
def runner(tokenizer: Any, word_ids: tuple[int, ...]) -> Iterator[ScriptedRunner]:
    r = ScriptedRunner(vocab=word_ids, eos=tokenizer.eos_token_id)
    yield r
    r.release()  # never leave the engine's worker thread blocked


@pytest.fixture
async def server(start_server: Callable[..., Any]) -> AsyncIterator[RunningServer]:
    async with start_server() as s:
        yield s


@pytest.fixture
def oai(server: RunningServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30
    ) as client:
        yield client


@pytest.fixture
async def client(server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        yield c


@pytest.fixture(autouse=True)
def wire_roundtrip(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    """Every JSON body an httpx client reads whole and every SSE event the test's
    parser reads (`server_helpers.parse_event`) must decode into its
    `sluiceway.protocol` type and re-encode to the same JSON: checked when the
    test ends."""
    recorder = Recorder()
    send = httpx.AsyncClient.send

    async def recording_send(
        self: httpx.AsyncClient, request: httpx.Request, **kwargs: Any
    ) -> httpx.Response:
        response = await send(self, request, **kwargs)
        json_body = response.headers.get("content-type", "").startswith("application/json")
        if not kwargs.get("stream") and json_body:
            recorder.bodies.append(
                (request.method, request.url.path, response.status_code, response.content)
            )
        return response

    parse_event = server_helpers.parse_event

    def recording_parse_event(line: str, result: server_helpers.StreamResult) -> None:
        parse_event(line, result)
        if line:
            recorder.events.append(line.removeprefix("data: "))

    monkeypatch.setattr(httpx.AsyncClient, "send", recording_send)
    monkeypatch.setattr(server_helpers, "parse_event", recording_parse_event)
    yield recorder
    recorder.check()
