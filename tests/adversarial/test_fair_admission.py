"""One request cannot take the whole server: what one request may ask for is bounded
(`--max-choices-per-request`, a 400 naming the limit), and free sequence slots go
first to the request running the fewest sequences, so another client's request
starts at the first slot that frees however many choices a big request has waiting.

The runner is gated: each step waits for a permit from the test, and records which
sequences were scheduled as it starts (before its permit), so what the scheduler
chose for the next step is known without running it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import attrs
import httpx
import pytest
import trio
from fakes import ScriptedRunner

from polling import eventually
from server_helpers import CHAT, COMPLETIONS, RawStream, chat, completion, engine_empty
from sluiceway.config import EngineConfig, ServerConfig
from sluiceway.engine.batch import SampledToken, StepBatch

LIMIT_S = 10


@attrs.define
class RecordingRunner(ScriptedRunner):
    scheduled: list[frozenset[int]] = attrs.field(factory=list)

    def step(self, batch: StepBatch) -> list[SampledToken]:
        self.scheduled.append(frozenset(c.seq_id for c in batch.chunks))
        return super().step(batch)


@pytest.fixture
def runner(tokenizer: Any, word_ids: tuple[int, ...]) -> Iterator[RecordingRunner]:
    r = RecordingRunner(vocab=word_ids, eos=tokenizer.eos_token_id, gated=True)
    yield r
    r.release()


def error_of(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 400, response.text[:300]
    error: dict[str, Any] = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    return error


async def test_more_choices_than_the_limit_is_a_400_naming_it(
    start_server: Callable[..., Any], runner: RecordingRunner
) -> None:
    """The issue's request (5 prompts x n=64) against the default limit of 128; then,
    under a limit of 4, a batch whose prompts alone exceed it blames the prompts,
    and a request exactly at the limit is served."""
    runner.open()
    async with (
        start_server() as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        body = completion(["a", "b", "c", "d", "e"], n=64, max_tokens=1)
        error = error_of(await client.post(COMPLETIONS, json=body))
        assert error["param"] == "n"
        assert "128" in error["message"] and "--max-choices-per-request" in error["message"]
        assert "320" in error["message"]
        assert engine_empty(server)
    async with (
        start_server(max_choices_per_request=4) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        batch = {"model": "test-model", "messages": [[{"role": "user", "content": "x"}]] * 5}
        error = error_of(await client.post(CHAT, json=batch))
        assert error["param"] == "messages" and "at most 4" in error["message"]
        error = error_of(await client.post(COMPLETIONS, json=completion(["a", "b"], n=3)))
        assert error["param"] == "n"
        ok = await client.post(COMPLETIONS, json=completion(["a", "b"], n=2, max_tokens=2))
        assert ok.status_code == 200 and len(ok.json()["choices"]) == 4


def test_by_default_one_request_cannot_fill_the_waiting_queue() -> None:
    """Even with every slot busy, a request at the per-request limit leaves room in
    the queue for other requests, which fair admission then starts first."""
    assert ServerConfig().max_choices_per_request < EngineConfig().max_waiting


async def test_a_later_request_starts_at_the_first_free_slot(
    start_server: Callable[..., Any], runner: RecordingRunner
) -> None:
    """Two slots. A streams 3 prompts x n=2 (six choices: two run, four wait); B's
    one choice arrives after A's first step. A's running choices end after two
    steps, and B's choice runs in the very next step, beside A's next one (in
    arrival order it would wait for all of A's)."""
    config = EngineConfig(max_num_seqs=2, burst_window=0)
    async with start_server(engine_config=config) as server:
        engine = server.state.engine

        def choices_in_engine() -> int:
            stats = engine.stats()
            return stats.num_running_seqs + stats.num_waiting_seqs

        big = await RawStream.post(
            server.url,
            COMPLETIONS,
            completion(["one", "two", "three"], n=2, max_tokens=2, stream=True),
        )
        await eventually(lambda: len(runner.scheduled) == 1, LIMIT_S)
        # Sequence ids follow arrival: A's choices are 0-5, B's will be 6.
        assert runner.scheduled[0] == {0, 1} and choices_in_engine() == 6
        small = await RawStream.post(server.url, CHAT, chat("later", max_tokens=2, stream=True))
        await eventually(lambda: choices_in_engine() == 7, LIMIT_S)
        runner.allow(2)  # A's running choices make their two tokens and end
        await eventually(lambda: len(runner.scheduled) == 3, LIMIT_S)
        assert runner.scheduled[1] == {0, 1}
        assert runner.scheduled[2] == {2, 6}
        runner.open()
        with trio.fail_after(LIMIT_S):
            for raw in (big, small):
                await raw.read_to_end()
                await raw.aclose()
        big_result, small_result = big.events(), small.events()
        big_result.check_well_formed()
        small_result.check_well_formed()
        assert sorted(big_result.finish_reasons()) == list(range(6))
        assert small_result.finish_reasons() == {0: "length"}
        await eventually(lambda: engine_empty(server), LIMIT_S)
