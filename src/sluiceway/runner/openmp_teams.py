"""OpenMP thread teams: freeing the team of the thread that model steps leave.

torch's CPU kernels (and the native kernels, which share its runtime by soname)
run on an OpenMP team that belongs to the OS thread calling them. The engine may
move steps between its model thread and the event loop's thread
(`--event-loop-decode-max-seqs`); it does so only with the release found here,
run on the thread left behind, so that one team exists at a time. This is the
torch side's knowledge: the engine only calls what it is handed.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

_OMP_PAUSE_HARD = 2  # OpenMP 5.0's omp_pause_resource_t


def _noop() -> None:
    pass


def find_openmp_pool_release() -> Callable[[], None] | None:
    """The function that frees the calling thread's OpenMP worker team, so that
    another thread can then run the model's kernels at full speed: GNU OpenMP's
    `omp_pause_resource_all(omp_pause_hard)`, which `libgomp` implements by joining
    and freeing the team of the thread that calls it. A no-op where no OpenMP
    runtime is loaded (nothing to free). None where the loaded runtime is not GNU
    OpenMP or lacks the call: steps must then stay on one thread.

    Why it matters: `libgomp` lets a waiting worker spin (`GOMP_SPINCOUNT`) only
    while it manages no more threads than there are CPUs (`do_spin` in its
    `config/linux/wait.h`). Once a second thread has a team, workers go to sleep
    between parallel regions and each region has to wake them again, and one
    stream ran at well under half its speed. Freed first, the next thread runs at
    full speed (`docs/benchmarks.md`).
    """
    runtimes = _loaded_openmp_runtimes()
    if runtimes is None:
        return None  # cannot tell what is loaded
    if not runtimes:
        return _noop
    if len(runtimes) > 1 or not os.path.basename(runtimes[0]).startswith("libgomp"):
        return None  # LLVM's and Intel's runtimes pause differently; not measured
    try:
        library = ctypes.CDLL(runtimes[0], mode=os.RTLD_NOLOAD | os.RTLD_NOW)
        pause = library.omp_pause_resource_all
    except (OSError, AttributeError):
        return None  # GCC before 9 has no pause
    pause.argtypes = [ctypes.c_int]
    pause.restype = ctypes.c_int

    def release() -> None:
        pause(_OMP_PAUSE_HARD)

    return release


def _loaded_openmp_runtimes() -> list[str] | None:
    """Paths of the OpenMP runtimes mapped into this process (torch's, which the
    native kernels share by soname), or None where this cannot be told (no /proc)."""
    try:
        with open("/proc/self/maps") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return None
    found: list[str] = []
    for line in lines:
        path = line.rpartition(" ")[2]
        name = os.path.basename(path)
        if name.startswith(("libgomp", "libiomp", "libomp")) and ".so" in name and path not in found:
            found.append(path)
    return found
