"""Same-process A/B of runner variants on the default model, interleaved.

    .venv/bin/python benchmarks/runner_ab.py --batch 32 --variants git:HEAD,new [--threads 1]
        [--quantization int4]

A variant `git:REF` is the runner package as of that commit (read with `git
show`); the others are named in VARIANTS (a patch active while the runner is
built, plus runner arguments). Decode steps alternate between variants so machine
noise (other processes on the 2 shared cores) hits both alike. Reports median
wall and CPU ms per decode step, CPU ms per prefill, and the median of per-round
ratios against the first variant.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch

from sluiceway.runner import linear
from sluiceway.runner.attention import TorchAttention
from sluiceway.runner.loading import load_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runner_decode import Decoder, build  # beside this file, not a package


def import_runner_at(ref: str):
    """`TorchModelRunner` from `src/sluiceway/runner` as of git `ref` (read with
    `git show`), importable next to the working tree's as `sluiceway_runner_<ref>`."""
    name = f"sluiceway_runner_{ref.replace('~', '_').replace('^', '_')}"
    root = Path(tempfile.mkdtemp()) / name
    files = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", ref, "src/sluiceway/runner/"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    root.mkdir()
    for path in files:
        if not path.endswith((".py", ".c", ".h")):  # modules and native kernel sources
            continue
        text = subprocess.run(
            ["git", "show", f"{ref}:{path}"], check=True, capture_output=True, text=True
        ).stdout
        target = root / Path(path).relative_to("src/sluiceway/runner")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text.replace("sluiceway.runner.", f"{name}."))
    sys.path.insert(0, str(root.parent))
    return importlib.import_module(f"{name}.model_runner").TorchModelRunner


def build_at(ref: str, dtype: str, batch: int, ctx: int, **kwargs):
    loaded = load_model(None, dtype, progress=False)
    blocks = batch * (-(-ctx // 16)) + 8
    cls = import_runner_at(ref)
    return cls.from_loaded(loaded, block_size=16, num_blocks=blocks, **kwargs), loaded


# name -> (patch active while the runner is built, extra runner arguments)
VARIANTS = {
    "base": (lambda: mock.patch.object(linear, "_mkldnn_packable", lambda w: False), {}),
    "new": (contextlib.nullcontext, {}),
    "int8": (contextlib.nullcontext, {"quantization": "int8"}),
    "int4": (contextlib.nullcontext, {"quantization": "int4"}),
    "sdpa-decode": (
        contextlib.nullcontext,
        {"attention": lambda kv: TorchAttention(kv, native_decode=False)},
    ),
    "int4-sdpa-decode": (
        contextlib.nullcontext,
        {"quantization": "int4", "attention": lambda kv: TorchAttention(kv, native_decode=False)},
    ),
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=4, help="decode steps per round")
    p.add_argument("--variants", default="git:HEAD,new")
    p.add_argument("--prefill-rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument(
        "--quantization", default=None, help="int8 or int4 for every variant (git: ones too)"
    )
    args = p.parse_args()
    quantized = {"quantization": args.quantization} if args.quantization else {}
    if args.threads:
        torch.set_num_threads(args.threads)
    names = args.variants.split(",")
    ctx = args.prompt + args.rounds * args.steps + 16
    decs = {}
    for name in names:
        if name.startswith("git:"):
            runner, _ = build_at(name[4:], args.dtype, args.batch, ctx, **quantized)
            decs[name] = Decoder(runner, args.batch, args.prompt, ctx)
            continue
        patch, kwargs = VARIANTS[name]
        with patch():
            runner, _ = build(args.dtype, args.batch, ctx, **{**quantized, **kwargs})
        decs[name] = Decoder(runner, args.batch, args.prompt, ctx)
    prefill: dict[str, list[float]] = {n: [] for n in names}
    for rnd in range(args.prefill_rounds):
        for name in names:
            dec = Decoder(decs[name].runner, args.batch, args.prompt, ctx, seed=rnd + 1)
            c = time.process_time()
            dec.step()
            prefill[name].append(time.process_time() - c)
    for name in names:
        decs[name].step()
    # CPU time next to wall time: with other processes on the cores, a step's CPU
    # time is the steadier figure (it excludes time spent descheduled).
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(args.rounds):
        for name in names:
            t, c = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                decs[name].step()
            wall[name].append((time.perf_counter() - t) / args.steps)
            cpu[name].append((time.process_time() - c) / args.steps)
    base = names[0]
    for name in names:
        med = statistics.median(wall[name])
        ratio = statistics.median(a / b for a, b in zip(wall[base], wall[name], strict=True))
        cpu_ratio = statistics.median(a / b for a, b in zip(cpu[base], cpu[name], strict=True))
        print(
            f"{name:>10}: prefill cpu {1000 * statistics.median(prefill[name]):7.1f} ms, decode {1000 * med:7.2f} ms/step "
            f"({args.batch / med:6.0f} tok/s), cpu {1000 * statistics.median(cpu[name]):7.2f} ms/step; "
            f"speedup vs {base}: wall x{ratio:.2f}, cpu x{cpu_ratio:.2f}"
        )
    outs = {n: d.tokens for n, d in decs.items()}
    print("same tokens:", {n: outs[n] == outs[base] for n in names})


if __name__ == "__main__":
    main()
