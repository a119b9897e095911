"""The model thread: one OS thread for every job, results and errors passed back."""

import threading

import pytest
import trio

from sluiceway.engine.step_threads import ModelThread


async def test_every_job_runs_on_the_same_thread_in_order():
    thread = ModelThread()
    seen = [thread.call(threading.get_ident)]
    for _ in range(3):
        seen.append(await thread.run(threading.get_ident))
    thread.stop()
    assert len(set(seen)) == 1 and seen[0] != threading.get_ident()


async def test_errors_come_back_to_the_caller():
    thread = ModelThread()

    def boom():
        raise ValueError("from the model thread")

    with pytest.raises(ValueError, match="from the model thread"):
        await thread.run(boom)
    with pytest.raises(ValueError, match="from the model thread"):
        thread.call(boom)
    thread.stop()


async def test_cancellation_waits_for_the_job_unless_abandoned():
    thread = ModelThread()
    release = threading.Event()
    finished = []

    def job():
        release.wait()
        finished.append(True)
        return "done"

    with trio.CancelScope() as scope:
        scope.cancel()
        # Not abandoned: the cancel is delivered only after the job returns.
        trio.lowlevel.current_trio_token().run_sync_soon(release.set)
        await thread.run(job)
    assert finished == [True]

    release.clear()
    with trio.move_on_after(0) as scope:
        await thread.run(job, abandon_on_cancel=True)
    assert scope.cancelled_caught and finished == [True]  # abandoned while still running
    release.set()
    assert thread.call(lambda: len(finished)) == 2  # the abandoned job did finish, later
    thread.stop()
