"""An idle engine woken by a request lets the rest of a burst arrive before its
first step (`EngineConfig.burst_window`)."""

import argparse

import pytest
import trio
import trio.testing
from engine_fakes import ByteTokenizer, ScriptedRunner

from sluiceway import flags
from sluiceway.config import EngineConfig
from sluiceway.engine.arrivals import Arrivals
from sluiceway.engine.engine import Engine
from sluiceway.engine.sampling_params import SamplingParams

tok = ByteTokenizer()
CLIENTS = 8


def _engine(runner: ScriptedRunner, **config) -> Engine:
    return Engine(runner, tok, EngineConfig(**config), eos_token_ids=[256], max_model_len=128)


async def _read_to_the_end(engine: Engine, prompt: str) -> float:
    """Generate 2 tokens for `prompt`; returns when the first came (trio time)."""
    async with engine.generate(tok.encode(prompt), SamplingParams(max_tokens=2)) as (ch,):
        first = None
        async for _ in ch:
            first = trio.current_time() if first is None else first
    assert first is not None
    return first


async def _staggered_burst(engine: Engine) -> None:
    """CLIENTS requests that reach the engine one after another, each after more of
    the event loop's work than the one before (as parallel HTTP requests do while
    they are parsed and tokenized)."""

    async def client(i: int) -> None:
        for _ in range(10 * i):
            await trio.lowlevel.checkpoint()
        await _read_to_the_end(engine, f"p{i}")

    async with trio.open_nursery() as clients:
        for i in range(CLIENTS):
            clients.start_soon(client, i)


@pytest.mark.parametrize(("window", "first_step_prompts"), [(0.05, CLIENTS), (0.0, 1)])
async def test_a_burst_of_parallel_requests_is_prefilled_in_one_step(
    autojump_clock, window, first_step_prompts
):
    runner = ScriptedRunner()
    engine = _engine(runner, burst_window=window)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        await _staggered_burst(engine)
        nursery.cancel_scope.cancel()
    assert len(runner.batches[0].chunks) == first_step_prompts
    # Every request ran to the end either way.
    assert sum(c.sample for b in runner.batches for c in b.chunks) == 2 * CLIENTS


async def test_a_lone_request_does_not_wait_for_the_window(autojump_clock):
    runner = ScriptedRunner()
    window = 0.05
    engine = _engine(runner, burst_window=window)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        for prompt in "ab":  # the second wakes the engine from idle again
            await engine.wait_idle()
            start = trio.current_time()
            # Only the quiet period: nothing else was being prepared.
            assert await _read_to_the_end(engine, prompt) - start < window / 10
        nursery.cancel_scope.cancel()


async def test_requests_still_being_prepared_join_the_first_step(autojump_clock):
    """Requests whose preparation takes far longer than the quiet period (large
    bodies tokenized on a thread) still join the first step, within the window."""
    runner = ScriptedRunner()
    engine = _engine(runner, burst_window=0.05)

    async def client(i: int) -> None:
        with engine.arrivals.preparing():
            await trio.sleep(0.002 * i)  # tokenizing, in trio's (mock) time
        await _read_to_the_end(engine, f"p{i}")

    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        async with trio.open_nursery() as clients:
            for i in range(CLIENTS):
                clients.start_soon(client, i)
        nursery.cancel_scope.cancel()
    assert len(runner.batches[0].chunks) == CLIENTS


async def test_a_request_that_is_never_ready_delays_the_first_step_by_the_window_only(
    autojump_clock,
):
    runner = ScriptedRunner()
    window = 0.02
    engine = _engine(runner, burst_window=window)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        with engine.arrivals.preparing():  # one that does not end meanwhile (a stalled upload)
            asked = trio.current_time()
            first = await _read_to_the_end(engine, "a")
        assert first - asked == pytest.approx(window)  # held back, but not for ever
        nursery.cancel_scope.cancel()


def test_a_preparation_ends_once_however_it_ends():
    arrivals = Arrivals()
    with arrivals.preparing() as arrival:
        assert arrivals.preparing_count == 1
        arrival.end()
        arrival.end()
        assert arrivals.preparing_count == 0
    assert arrivals.preparing_count == 0
    with pytest.raises(KeyError), arrivals.preparing():
        raise KeyError
    assert arrivals.preparing_count == 0


def test_the_burst_window_is_a_serve_flag():
    parser = argparse.ArgumentParser()
    flags.add_engine_flags(parser)
    assert flags.engine_config(parser.parse_args([])).burst_window == 0.05
    assert flags.engine_config(parser.parse_args(["--burst-window", "0"])).burst_window == 0
    for bad in ("-1", "inf", "nan"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--burst-window", bad])
    with pytest.raises(ValueError):
        EngineConfig(burst_window=-0.1)
