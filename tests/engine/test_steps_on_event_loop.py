"""Steps on the event loop's own thread (`EngineConfig.steps_on_event_loop`)."""

import argparse
import threading

import pytest
import trio
import trio.testing
from engine_fakes import ByteTokenizer, ScriptedRunner

from sluiceway import cli, flags
from sluiceway.config import EngineConfig
from sluiceway.engine.engine import Engine
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.engine.step_threads import CallingThread

tok = ByteTokenizer()


async def test_a_call_runs_on_this_thread_after_every_task_already_runnable():
    thread = CallingThread()
    assert thread.call(threading.get_ident) == threading.get_ident()
    order: list[str] = []
    send, receive = trio.open_memory_channel[int](1)

    async def reader() -> None:
        async for i in receive:
            order.append(f"read {i}")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()  # parked in receive, as a consumer is
        # trio runs each batch of runnable tasks in either order, so with one
        # checkpoint `fn` would go before the woken reader about half the time.
        for i in range(30):
            send.send_nowait(i)  # wakes the reader, as a delivery wakes a consumer
            ident = await thread.run(lambda i=i: order.append(f"fn {i}") or threading.get_ident())
            assert ident == threading.get_ident()
        send.close()
    assert order == [entry for i in range(30) for entry in (f"read {i}", f"fn {i}")]


async def test_a_cancelled_call_never_runs_and_cannot_be_abandoned():
    thread = CallingThread()
    ran = []
    with trio.CancelScope() as scope:
        scope.cancel()
        await thread.run(lambda: ran.append(True))
    assert scope.cancelled_caught and ran == []
    with pytest.raises(ValueError, match="cannot be abandoned"):
        await thread.run(lambda: None, abandon_on_cancel=True)


class _RecordingRunner(ScriptedRunner):
    """Notes each step, and the thread it ran on, in a shared log."""

    def __init__(self, log: list[str], threads: set[int]) -> None:
        super().__init__(num_blocks=64, block_size=4)
        self._log, self._threads = log, threads

    def step(self, batch):
        self._threads.add(threading.get_ident())
        self._log.append("step")
        return super().step(batch)


async def test_each_token_reaches_its_reader_before_the_next_step():
    log: list[str] = []
    threads: set[int] = set()
    config = EngineConfig(steps_on_event_loop=True)
    engine = Engine(
        _RecordingRunner(log, threads), tok, config, eos_token_ids=[256], max_model_len=128
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        async with engine.generate(tok.encode("ab"), SamplingParams(max_tokens=5)) as (channel,):
            async for delta in channel:
                log.append(f"token {delta.text}")
        nursery.cancel_scope.cancel()
    assert log == [entry for c in "cdefg" for entry in ("step", f"token {c}")]
    assert threads == {threading.get_ident()}


def test_a_step_timeout_needs_the_model_thread():
    with pytest.raises(ValueError, match="needs steps on the model thread"):
        EngineConfig(steps_on_event_loop=True, step_timeout=5.0)


def _serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    flags.add_engine_flags(parser)
    return parser.parse_args(list(argv))


def test_the_cli_keeps_its_watchdog_default_only_on_the_model_thread(capsys):
    default = flags.engine_config(_serve_args())
    assert (default.steps_on_event_loop, default.step_timeout) == (False, flags.DEFAULT_STEP_TIMEOUT)
    on_loop = flags.engine_config(_serve_args("--steps-on-event-loop"))
    assert (on_loop.steps_on_event_loop, on_loop.step_timeout) == (True, None)
    # Both at once: refused before any model is loaded.
    assert cli.main(["serve", "--steps-on-event-loop", "--step-timeout", "5"]) == 2
    assert "needs steps on the model thread" in capsys.readouterr().err
