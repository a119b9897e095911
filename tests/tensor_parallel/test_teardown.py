"""Ending the ranks is owned by whichever path gets there first: a failed step and
concurrent `close` calls end them once and close each pipe once, and a `close`
never closes a pipe that a step on another thread is still waiting on."""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from typing import Any

import pytest
from tp_helpers import alive, start_ranks, tiny_llama

from sluiceway.engine.batch import ScheduledChunk, StepBatch
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.runner.tensor_parallel import TensorParallelRunner
from sluiceway.runner.tensor_parallel.sharding import TensorParallelError

CLOSERS = 3


def _step_sent_event(runner: TensorParallelRunner) -> threading.Event:
    """Set once a step's command has gone to rank 0: the step is then in flight."""
    sent = threading.Event()
    pipe = runner._commands
    real_send = pipe.send

    def noting_send(message: Any) -> None:
        real_send(message)
        sent.set()

    pipe.send = noting_send
    return sent


def _count_pipe_closes(runner: TensorParallelRunner) -> Counter[str]:
    closes: Counter[str] = Counter()
    for name in ("_lifeline", "_commands"):
        pipe = getattr(runner, name)
        real_close = pipe.close

        def counting_close(name: str = name, real_close: Any = real_close) -> None:
            closes[name] += 1
            real_close()

        pipe.close = counting_close
    return closes


def _one_chunk() -> StepBatch:
    chunk = ScheduledChunk(
        seq_id=1,
        token_ids=[5, 17, 99],
        start_pos=0,
        block_table=[1],
        sample=True,
        params=SamplingParams(temperature=0.0),
    )
    return StepBatch(chunks=(chunk,))


def test_a_failing_step_and_concurrent_closes_end_the_ranks_once() -> None:
    runner = start_ranks(tiny_llama(kv_heads=2), 2)
    closes = _count_pipe_closes(runner)
    assert len(runner.step(_one_chunk())) == 1  # a sound step first
    # Rank 1 stopped: the next step waits on rank 0, which waits on rank 1.
    os.kill(runner.rank_pids[1], signal.SIGSTOP)
    step_sent = _step_sent_event(runner)
    start = threading.Barrier(CLOSERS + 1)  # the closers and the killer
    outcomes: list[BaseException | None] = []

    def run(action: Any) -> None:
        try:
            action()
        except BaseException as exc:
            outcomes.append(exc)
        else:
            outcomes.append(None)

    def close_with_the_others() -> None:
        start.wait()
        runner.close()

    threads = [threading.Thread(target=run, args=(lambda: runner.step(_one_chunk()),))]
    threads[0].start()
    assert step_sent.wait(timeout=60)
    threads += [threading.Thread(target=run, args=(close_with_the_others,)) for _ in range(CLOSERS)]
    for thread in threads[1:]:
        thread.start()
    # Killing the stopped rank fails the step in flight while the closers start.
    os.kill(runner.rank_pids[1], signal.SIGKILL)
    start.wait()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a step or close hung"
    errors = [o for o in outcomes if o is not None]
    # The step fails (its rank is gone, or the runner closed under it); every
    # close returns normally.
    assert len(outcomes) == CLOSERS + 1
    assert len(errors) == 1 and isinstance(errors[0], TensorParallelError), outcomes
    assert closes == {"_lifeline": 1, "_commands": 1}
    assert not any(alive(pid) for pid in runner.rank_pids)
    runner.close()  # later calls return at once and close nothing again
    assert closes == {"_lifeline": 1, "_commands": 1}
    with pytest.raises(TensorParallelError):
        runner.step(_one_chunk())
