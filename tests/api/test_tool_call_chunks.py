"""Streamed tool calls as the clients that read them expect: at most one
`delta.tool_calls` entry per call index in any chunk, the first with the call's
id, type and name. Over a runner that answers with fixed calls, so the chunk
boundaries are the tokenizer's and the engine's, not a sampler's."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Literal

import attrs
import httpx
import openai
import pytest
from pydantic import BaseModel

from server_helpers import CHAT, StreamResult, chat, stream
from sluiceway.api.serve import RunningServer
from sluiceway.engine.batch import SampledToken, StepBatch

from .conftest import MODEL, in_thread


@attrs.define
class AnswerRunner:
    """Every sequence's output is `answer` (token ids), then end of sequence. The
    answer must be what the request's grammar allows: the engine checks each token,
    though this runner does not read the masks."""

    eos: int
    answer: tuple[int, ...] = ()
    num_blocks: int = 512
    block_size: int = 16
    _sampled: dict[int, int] = attrs.field(factory=dict)  # seq id -> tokens given

    def step(self, batch: StepBatch) -> list[SampledToken]:
        if batch.token_masks is not None:
            batch.token_masks.wait()  # the matchers are busy until their masks are filled
        out = []
        for c in batch.chunks:
            if c.sample:
                i = self._sampled.get(c.seq_id, 0)
                self._sampled[c.seq_id] = i + 1
                token = self.answer[i] if i < len(self.answer) else self.eos
                out.append(SampledToken(c.seq_id, token, -0.25, ()))
        return out


def call_text(name: str, arguments: dict[str, Any]) -> str:
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
NOW = {
    "type": "function",
    "function": {"name": "now", "parameters": {"type": "object", "properties": {}}},
}
PARALLEL = (
    "Let me check.\n"
    + call_text("get_weather", {"city": "Zürich", "days": 3})
    + "\n"
    + call_text("now", {})
    + "\n"
    + call_text("get_weather", {"city": "Oslo"})
)


class Weather(BaseModel):
    city: str
    days: int
    sky: Literal["clear", "cloudy", "rain"]


@pytest.fixture
def answer_runner(tokenizer: Any) -> AnswerRunner:
    return AnswerRunner(eos=tokenizer.eos_token_id)


@pytest.fixture
async def answer_server(
    answer_runner: AnswerRunner, serve_runner: Callable[..., Any]
) -> AsyncIterator[RunningServer]:
    async with serve_runner(answer_runner) as s:
        yield s


@pytest.fixture
def sdk(answer_server: RunningServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=answer_server.url + "/v1", api_key="unused", max_retries=0, timeout=30
    ) as client:
        yield client


def answer_with(runner: AnswerRunner, tokenizer: Any, text: str) -> None:
    runner.answer = tuple(tokenizer.encode(text, add_special_tokens=False))


def assert_one_entry_per_index(result: StreamResult) -> None:
    """No chunk has two entries for one call, and each call's first entry says
    which call it is."""
    seen: set[int] = set()
    for chunk in result.chunks:
        for choice in chunk["choices"]:
            pieces = choice["delta"].get("tool_calls") or []
            indexes = [p["index"] for p in pieces]
            assert len(indexes) == len(set(indexes)), chunk
            for piece in pieces:
                if piece["index"] not in seen:
                    seen.add(piece["index"])
                    assert piece["id"].startswith("call_") and piece["type"] == "function"
                    assert piece["function"]["name"], piece
                else:
                    assert "id" not in piece and "name" not in piece["function"], piece


async def test_raw_chunks_carry_one_entry_per_call(
    answer_server: RunningServer, answer_runner: AnswerRunner, tokenizer: Any
) -> None:
    answer_with(answer_runner, tokenizer, PARALLEL)
    body = chat("weather?", tools=[WEATHER, NOW], max_tokens=200)
    async with httpx.AsyncClient(base_url=answer_server.url, timeout=30) as client:
        whole = (await client.post(CHAT, json=body)).json()["choices"][0]["message"]
        result = await stream(client, CHAT, body)
    assert result.done and not result.errors
    assert_one_entry_per_index(result)
    calls: dict[int, list[str]] = {}
    for choice in result.by_index()[0]:
        for piece in choice["delta"].get("tool_calls") or []:
            function = piece["function"]
            if "name" in function:
                calls[piece["index"]] = [function["name"], ""]
            calls[piece["index"]][1] += function.get("arguments", "")
    assert [tuple(c) for c in calls.values()] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in whole["tool_calls"]
    ]
    assert len(calls) == 3 and result.texts()[0].strip() == whole["content"] == "Let me check."
    assert result.finish_reasons() == {0: "tool_calls"}


async def test_openai_stream_final_completion_has_every_call(
    sdk: openai.OpenAI, answer_runner: AnswerRunner, tokenizer: Any
) -> None:
    answer_with(answer_runner, tokenizer, PARALLEL)

    def final() -> Any:
        with sdk.chat.completions.stream(
            model=MODEL,
            messages=[{"role": "user", "content": "weather?"}],
            tools=[WEATHER, NOW],  # type: ignore[list-item]
            max_tokens=200,
        ) as events:
            return events.get_final_completion()

    message = (await in_thread(final)).choices[0].message
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("get_weather", {"city": "Zürich", "days": 3}),
        ("now", {}),
        ("get_weather", {"city": "Oslo"}),
    ]
    assert len({c.id for c in message.tool_calls}) == 3
    assert (message.content or "").strip() == "Let me check."


async def test_instructor_create_partial_ends_with_the_whole_object(
    sdk: openai.OpenAI, answer_runner: AnswerRunner, tokenizer: Any
) -> None:
    import instructor

    # create_partial names its tool after the partial model it builds.
    answer_with(
        answer_runner,
        tokenizer,
        call_text("PartialWeather", {"city": "Paris", "days": 2, "sky": "rain"}),
    )
    client = instructor.from_openai(sdk, mode=instructor.Mode.TOOLS)

    def partials() -> list[Any]:
        return list(
            client.chat.completions.create_partial(
                model=MODEL,
                response_model=Weather,
                messages=[{"role": "user", "content": "weather?"}],
                max_tokens=200,
                max_retries=0,
            )
        )

    seen = await in_thread(partials)
    assert seen and seen[-1].model_dump() == {"city": "Paris", "days": 2, "sky": "rain"}
