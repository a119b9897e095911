"""sluiceway.client against the real sluiceway server (scripted runner) in the test's
nursery: both APIs streamed and not, the fan-out helpers, cancellation reaching the
engine, and run_many with good and bad requests mixed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import attrs
import pytest
import trio

from polling import eventually
from server_helpers import StepGate, scripted_token
from sluiceway.api.serve import RunningServer
from sluiceway.client import (
    AsyncClient,
    BadRequestError,
    ChatCall,
    ChoiceStream,
    CompletionCall,
    NotFoundError,
)
from sluiceway.engine.batch import SampledToken, StepBatch
from sluiceway.protocol import ChatCompletion, Completion

MODEL = "client-test-model"


@attrs.define
class GateRunner(StepGate):
    """Deterministic tokens (a function of the sequence alone, so a prompt's answer is
    the same alone or in a batch); never EOS. Gated like the other scripted runners."""

    vocab: tuple[int, ...]
    num_blocks: int = 512
    block_size: int = 16

    def step(self, batch: StepBatch) -> list[SampledToken]:
        self.wait_for_permit()
        return [
            SampledToken(c.seq_id, scripted_token(self.vocab, c), -0.25, ())
            for c in batch.chunks
            if c.sample
        ]


@pytest.fixture
def live_runner(word_ids: tuple[int, ...]) -> Iterator[GateRunner]:
    runner = GateRunner(vocab=word_ids)
    yield runner
    runner.open()  # never leave the engine's worker thread blocked


@pytest.fixture
async def live_server(
    live_runner: GateRunner, serve_runner: Callable[..., Any]
) -> AsyncIterator[RunningServer]:
    async with serve_runner(live_runner, model_name=MODEL) as server:
        yield server


@pytest.fixture
async def live(live_server: RunningServer) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(live_server.url, timeout=30, max_retries=0) as client:
        yield client


def _user(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def _aborted(server: RunningServer) -> float:
    value = server.state.metrics.registry.get_sample_value(
        "sluiceway_requests_finished_total", {"reason": "abort"}
    )
    return value or 0.0


# ------------------------------------------------------------------ plain calls


async def test_models_and_chat_streaming_matches_non_streaming(live: AsyncClient) -> None:
    with trio.fail_after(20):
        models = await live.models.list()
        assert [m.id for m in models.data] == [MODEL]
        reply = await live.chat.completions.create(
            model=MODEL, messages=_user("hello"), max_tokens=6
        )
        assert isinstance(reply, ChatCompletion)
        (choice,) = reply.choices
        assert choice.finish_reason == "length" and choice.message.role == "assistant"
        assert choice.message.content
        assert reply.usage is not None and reply.usage.completion_tokens == 6

        text, finishes, usage = "", [], None
        async with await live.chat.completions.create(
            model=MODEL,
            messages=_user("hello"),
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        ) as stream:
            async for chunk in stream:
                for c in chunk.choices:
                    text += c.text
                    finishes.append(c.finish_reason)
                usage = chunk.usage or usage
    assert text == choice.message.content  # greedy and deterministic: the same answer
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert usage is not None and usage.completion_tokens == 6


async def test_completions_streaming_matches_non_streaming(live: AsyncClient) -> None:
    with trio.fail_after(20):
        done = await live.completions.create(model=MODEL, prompt="Once upon", max_tokens=5)
        assert isinstance(done, Completion)
        (choice,) = done.choices
        assert choice.finish_reason == "length" and choice.text
        assert done.usage is not None and done.usage.completion_tokens == 5

        parts, last = [], None
        async with await live.completions.create(
            model=MODEL, prompt="Once upon", max_tokens=5, stream=True
        ) as stream:
            async for chunk in stream:
                for c in chunk.choices:
                    parts.append(c.text)
                    last = c.finish_reason
    assert "".join(parts) == choice.text
    assert last == "length"


# --------------------------------------------------------------------- fan-out


async def _collect_all(choices: Any) -> dict[int, str]:
    texts: dict[int, str] = {}

    async def consume(choice: ChoiceStream) -> None:
        texts[choice.index] = await choice.collect()
        assert choice.finish_reason == "length"

    async with trio.open_nursery() as nursery:
        for choice in choices:
            nursery.start_soon(consume, choice)
    return texts


async def test_stream_choices_batch_prompts_with_n(live: AsyncClient) -> None:
    prompts = ["The river", "A quiet bridge", "On the"]
    with trio.fail_after(20):
        alone = [
            (await live.completions.create(model=MODEL, prompt=p, max_tokens=4)).choices[0].text
            for p in prompts
        ]
        async with live.stream_choices(
            model=MODEL, prompt=prompts, n=2, max_tokens=4, stream_options={"include_usage": True}
        ) as choices:
            assert len(choices) == 6
            texts = await _collect_all(choices)
    assert sorted(texts) == list(range(6))
    for i, text in texts.items():
        assert choices[i].prompt_index == i // 2
        assert text == alone[i // 2]  # choice i belongs to prompt i // n; greedy
    assert [c.text for c in choices.for_prompt(1)] == [alone[1]] * 2
    assert choices.error is None
    # The usage chunk follows the last finish_reason; the block waits for it.
    assert choices.usage is not None
    assert choices.usage.completion_tokens == 6 * 4


async def test_stream_choices_batch_chat(live: AsyncClient) -> None:
    conversations = [_user("hi"), _user("tell me about rivers"), _user("and bridges?")]
    with trio.fail_after(20):
        alone = []
        for conv in conversations:
            reply = await live.chat.completions.create(model=MODEL, messages=conv, max_tokens=5)
            alone.append(reply.choices[0].message.content)
        async with live.stream_choices(
            model=MODEL, messages=conversations, max_tokens=5
        ) as choices:
            texts = await _collect_all(choices)
    assert [texts[i] for i in range(3)] == alone  # each answer equals its answer alone
    assert choices.texts() == alone


async def test_stream_choices_n_greater_than_one(live: AsyncClient) -> None:
    with trio.fail_after(20):
        async with live.stream_choices(
            model=MODEL, messages=_user("same question"), n=3, max_tokens=7
        ) as choices:
            texts = await _collect_all(choices)
    assert sorted(texts) == [0, 1, 2]
    assert all(c.prompt_index == 0 for c in choices)
    assert len(set(texts.values())) == 1 and texts[0]  # greedy: n identical answers


# ---------------------------------------------------------------- cancellation


async def test_leaving_a_stream_midway_aborts_in_the_engine(
    live_server: RunningServer, live_runner: GateRunner, live: AsyncClient
) -> None:
    live_runner.gated = True
    engine = live_server.state.engine
    with trio.fail_after(20):
        assert (await live.metrics())["sluiceway_requests_running"] == 0
        async with await live.chat.completions.create(
            model=MODEL, messages=_user("a long answer"), max_tokens=1500, stream=True
        ) as stream:
            live_runner.allow(3)  # prefill and a couple of decode steps
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].text:
                    break  # mid-way: leaving the block closes the HTTP stream
            assert (await live.metrics())["sluiceway_requests_running"] == 1
        # The server sees the hang-up and aborts the choice...
        await eventually(lambda: _aborted(live_server) == 1)
        live_runner.open()  # ...and the engine drops it at its next step.
        await engine.wait_idle()
        stats = engine.stats()
        assert stats.num_running_seqs == 0 and stats.kv_blocks_used == 0
        assert (await live.metrics())["sluiceway_requests_running"] == 0
        assert stats.generation_tokens_total < 20  # not the 1500 it asked for


async def test_cancelling_stream_choices_drops_every_choice(
    live_server: RunningServer, live_runner: GateRunner, live: AsyncClient
) -> None:
    live_runner.gated = True
    engine = live_server.state.engine
    with trio.fail_after(20):
        with trio.CancelScope() as scope:
            async with live.stream_choices(
                model=MODEL, prompt=["first", "second"], n=2, max_tokens=1500
            ) as choices:
                live_runner.allow(3)
                async for event in choices[3]:
                    if event.text:
                        break
                metrics = await live.metrics()
                assert metrics["sluiceway_requests_running"] == 4
                scope.cancel()  # a trio cancellation, as a deadline or Ctrl-C would be
                await trio.sleep_forever()
        assert scope.cancelled_caught
        await eventually(lambda: _aborted(live_server) == 4)
        live_runner.open()
        await engine.wait_idle()
        assert engine.stats().num_running_seqs == 0
        assert (await live.metrics())["sluiceway_requests_running"] == 0
        assert engine.stats().generation_tokens_total < 4 * 20


# -------------------------------------------------------------------- run_many


async def test_run_many_mixes_good_and_bad_requests(live: AsyncClient) -> None:
    requests: list[Any] = [
        {"model": MODEL, "messages": _user("one"), "max_tokens": 3},
        {"model": MODEL, "messages": _user("two"), "max_tokens": -1},  # 400
        CompletionCall(prompt="three", model=MODEL, params={"max_tokens": 4}),
        ChatCall(messages=_user("four"), model="no-such-model", params={"max_tokens": 2}),
        {"model": MODEL, "prompt": ["five", "six"], "max_tokens": 2, "n": 2},
        {"model": MODEL, "prompt": "seven", "temperature": -1.0},  # 400
    ]
    with trio.fail_after(30):
        results = await live.run_many(requests, max_concurrency=3)
    assert len(results) == len(requests)
    ok_chat, bad_tokens, ok_completion, bad_model, ok_batch, bad_temperature = results
    assert isinstance(ok_chat, ChatCompletion)
    assert ok_chat.usage is not None and ok_chat.usage.completion_tokens == 3
    assert isinstance(bad_tokens, BadRequestError) and bad_tokens.error is not None
    assert bad_tokens.error.type == "invalid_request_error"
    assert (
        isinstance(ok_completion, Completion) and ok_completion.choices[0].finish_reason == "length"
    )
    assert isinstance(bad_model, NotFoundError) and bad_model.error is not None
    assert isinstance(ok_batch, Completion)
    assert sorted(c.index for c in ok_batch.choices) == [0, 1, 2, 3]
    assert isinstance(bad_temperature, BadRequestError)


async def test_run_many_fail_fast_raises_the_first_error(live: AsyncClient) -> None:
    requests = [
        {"model": MODEL, "prompt": "fine", "max_tokens": 2},
        {"model": MODEL, "prompt": "bad", "max_tokens": -5},
    ]
    with trio.fail_after(20), pytest.raises(BadRequestError):
        await live.run_many(requests, max_concurrency=1, fail_fast=True)


async def test_tool_calls_and_json_outputs_decode_into_the_shared_types(
    tokenizer: Any, serve_runner: Callable[..., Any]
) -> None:
    from grammar_runner import MaskFollowingRunner

    tool = {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {"type": "object", "properties": {"key": {"enum": ["a", "b"]}}, "required": ["key"]},
        },
    }
    async with serve_runner(MaskFollowingRunner(tokenizer), model_name=MODEL) as server:
        async with AsyncClient(server.url, timeout=60, max_retries=0) as client:
            answer = await client.chat.completions.create(
                messages=[{"role": "user", "content": "look it up"}],
                tools=[tool],
                tool_choice="required",
                max_tokens=100,
            )
            call = answer.choices[0].message.tool_calls[0]  # type: ignore[index]
            assert answer.choices[0].finish_reason == "tool_calls"
            assert call.function.name == "lookup" and call.function.arguments in (
                '{"key": "a"}',
                '{"key": "b"}',
            )
            pieces = []
            async with await client.chat.completions.create(
                messages=[{"role": "user", "content": "look it up"}],
                tools=[tool],
                tool_choice="required",
                max_tokens=100,
                stream=True,
            ) as stream:
                async for chunk in stream:
                    for choice in chunk.choices:
                        pieces.extend(choice.delta.tool_calls or [])
            assert pieces[0].function is not None and pieces[0].function.name == "lookup"
