"""`find_openmp_pool_release` frees the calling thread's OpenMP team (torch's libgomp)."""

import os
import threading

import pytest
import torch

from sluiceway.runner.openmp_teams import find_openmp_pool_release


def _os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_the_release_joins_the_team_of_the_thread_that_calls_it():
    if "OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("this torch does not run its kernels on OpenMP")
    release = find_openmp_pool_release()
    assert release is not None, "torch's libgomp should be found and able to pause"
    counts: list[int] = []

    def body() -> None:
        torch.set_num_threads(2)  # a team of this thread and one worker, on any machine
        x = torch.ones(1 << 22)
        x.add_(1)  # large enough for ATen to split it across the team
        counts.append(_os_threads())
        release()
        counts.append(_os_threads())
        x.add_(1)  # the thread can still run kernels: it gets a new team
        counts.append(_os_threads())
        release()

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    with_team, released, again = counts
    assert released == with_team - 1 and again == with_team
