"""Cancelling the engine loop (the server's shutdown) while a step runs on the model
thread: the step is waited for, not abandoned, and the thread is gone when `run`
returns, so no torch code is still running while the interpreter exits (that
aborted the process with "terminate called without an active exception")."""

import threading

import trio
import trio.testing
from engine_fakes import ByteTokenizer, ScriptedRunner

from sluiceway.config import EngineConfig
from sluiceway.engine.engine import Engine
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.engine.step_threads import ModelThread

tok = ByteTokenizer()


class _ThreadRecordingRunner(ScriptedRunner):
    """Records the thread each step ran on and how many steps have returned."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__(num_blocks=64, block_size=4, gate=gate)
        self.threads: list[threading.Thread] = []
        self.returned = 0

    def step(self, batch):
        self.threads.append(threading.current_thread())
        try:
            return super().step(batch)
        finally:
            self.returned += 1


def _served_engine(runner: _ThreadRecordingRunner) -> Engine:
    """An engine as the server builds one: a step watchdog, and the thread that
    loaded the model passed in."""
    return Engine(
        runner,
        tok,
        # The tests' clock stands still, and the burst wait before a first step
        # runs on trio's clock: no burst window, so the first step starts at once.
        EngineConfig(step_timeout=30, burst_window=0),
        eos_token_ids=[256],
        max_model_len=128,
        model_thread=ModelThread(name="test-model"),
    )


async def test_cancelling_the_loop_waits_for_a_watched_step_and_stops_the_model_thread(mock_clock):
    # The clock stands still: the watchdog (step_timeout) can never be what ends the
    # wait. The server passes the thread that loaded the model and has a watchdog.
    gate = threading.Event()
    runner = _ThreadRecordingRunner(gate)
    engine = _served_engine(runner)
    scope = trio.CancelScope()
    at_return: list[tuple[int, list[bool]]] = []

    async def run_engine(task_status=trio.TASK_STATUS_IGNORED):
        with scope:
            await engine.run(task_status=task_status)
        at_return.append((runner.returned, [t.is_alive() for t in runner.threads]))

    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(run_engine)
            async with engine.generate([97], SamplingParams(max_tokens=5)) as (ch,):
                assert await trio.to_thread.run_sync(runner.entered.wait, 10)  # step 0 runs
                scope.cancel()
                await trio.testing.wait_all_tasks_blocked()
                # Still waiting for the step (before the fix the step was abandoned
                # and `run` had already returned with the step still running).
                assert at_return == []
                gate.set()
                deltas = [delta async for delta in ch]
    finally:
        gate.set()  # never leave the model thread blocked
    # `run` returned after the step had, and after its thread had exited.
    assert at_return == [(1, [False])]
    # The step's token was delivered, then the loop stopped.
    assert [len(d.token_ids) for d in deltas] == [1, 0]
    assert deltas[-1].finish_reason == "error" and "stopped" in deltas[-1].error


async def test_the_thread_that_loaded_the_model_is_gone_when_the_loop_ends(mock_clock):
    # The server passes in the thread that loaded the model; nothing else stops it.
    runner = _ThreadRecordingRunner(threading.Event())
    runner.gate.set()
    engine = _served_engine(runner)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        async with engine.generate([97], SamplingParams(max_tokens=3)) as (ch,):
            assert len([d async for d in ch]) == 3
        await engine.wait_idle()
        nursery.cancel_scope.cancel()  # the engine is idle: no step in flight
    model_threads = {t for t in runner.threads if t is not threading.current_thread()}
    assert model_threads and not any(t.is_alive() for t in model_threads)
