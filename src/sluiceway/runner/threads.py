"""The threads a process's model work runs on.

torch's CPU operators and the native kernels (`runner/native/`, which link torch's
own libgomp and take `torch.get_num_threads()` for every call) share one OpenMP
team per calling thread, so one count sizes all of them: `--threads`, by default
the cores this process may run on (its affinity mask, as `taskset` or a container's
cpuset sets it). More threads than cores make every parallel region wait for a
descheduled member.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)


def available_cores() -> int:
    """The CPUs in this process's affinity mask (all of them where the OS has none)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def use_threads(requested: int | None) -> int:
    """Run torch's operators and the native kernels on `requested` threads (None: the
    available cores), from now on and on every thread that calls them; returns the
    count. Warns when it is more than the available cores."""
    import torch

    cores = available_cores()
    count = requested or cores
    if count > cores:
        logger.warning("--threads %d is more than the %d cores this process may use", count, cores)
    torch.set_num_threads(count)
    return count
