"""`--threads N`: the model's work runs on one OpenMP team of N threads, which torch's
operators and the native kernels share (`runner/threads.py`), whatever N is and
whatever the cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from sluiceway.config import ModelConfig
from sluiceway.flags import add_model_flags, model_config
from sluiceway.runner.threads import available_cores

# In a fresh interpreter: the thread count set, then the default model loaded as the
# server loads it, a long prompt (torch's dense products over unpacked tiles) and
# decode steps (the native one-token step and int8_dot); the process's OS threads
# before the model's work and after it, and the count torch reports. Setting the
# count starts torch's pthreadpool (N - 1 threads that sleep unless XNNPACK-style
# operators run) before the first count, so the difference is what the model's
# work started.
_CHILD = textwrap.dedent(
    """
    import json, os, sys
    import torch
    from sluiceway.config import EngineConfig, ModelConfig
    from sluiceway.model_engine import load_bundle
    from sluiceway.engine.batch import ScheduledChunk, StepBatch
    from sluiceway.engine.sampling_params import SamplingParams
    from sluiceway.runner.threads import use_threads

    threads = int(sys.argv[1])
    use_threads(threads)
    before = len(os.listdir("/proc/self/task"))
    bundle = load_bundle(
        ModelConfig(threads=threads), EngineConfig(num_kv_blocks=64), progress=False
    )
    runner = bundle.runner
    tokens = list(range(100, 100 + 300))
    table = list(range(1, 1 + -(-(len(tokens) + 8) // runner.block_size)))
    greedy = SamplingParams(temperature=0.0)
    done = 0
    for _ in range(6):
        chunk = ScheduledChunk(0, tokens[done:], done, table, True, greedy)
        done = len(tokens)
        (sampled,) = runner.step(StepBatch(chunks=(chunk,)))
        tokens.append(sampled.token_id)
    print(json.dumps({
        "started": len(os.listdir("/proc/self/task")) - before,
        "torch_threads": torch.get_num_threads(),
        "quantization": bundle.quantization,
    }))
    """
)


def _run(threads: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(threads)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_one_team_of_n_threads_serves_torch_and_the_native_kernels():
    """With N threads the model's work starts exactly N - 1 threads: the workers of
    one OpenMP team, the caller being the N-th. Kernels on a pool of their own
    (another OpenMP runtime, or threads of their own) would add theirs beside it,
    2 (N - 1) or more, and oversubscribe the cores. Three threads on a two-core
    machine count alike: the team's size is the flag's, not the machine's."""
    if "OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("this torch does not run its kernels on OpenMP")
    runs = {n: _run(n) for n in (1, 2, 3)}
    assert runs[1]["quantization"] is not None, "the default model should run the native kernels"
    for n, run in runs.items():
        assert run["torch_threads"] == n
        assert run["started"] == n - 1, (n, run)


def test_the_flag_and_its_default():
    import argparse

    parser = argparse.ArgumentParser()
    add_model_flags(parser)
    parser.add_argument("--served-model-name", default=None)
    assert model_config(parser.parse_args(["--threads", "3"])).threads == 3
    assert model_config(parser.parse_args([])).threads is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--threads", "0"])
    with pytest.raises(ValueError):
        ModelConfig(threads=0)
    assert available_cores() == len(os.sched_getaffinity(0))
