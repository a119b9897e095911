"""What a decode step costs with tensor parallelism beyond one device, and where it goes.

    PYTHONPATH=src .venv/bin/python benchmarks/tp_step_cost.py --tp 3 --batches 1 8

Loads the default model (or `--model`, a model directory or GGUF; float32), builds a one-device `TorchModelRunner` and a
`TensorParallelRunner` over `--tp` ranks on this machine (every rank and the
one-device runner on `--threads` torch threads), prefills `batch` random prompts
on both, then times decode steps alternately, `--rounds` rounds of `--steps`
steps, so that a shared machine's noise falls on both. Per batch size it prints
the median step on one device and with tp, and the tp step's parts (from
`TensorParallelRunner.last_step`): rank 0's own step, the part of it in
collectives (2 all-reduces a layer, one for the embedding, one gather of the
logits; waiting for slower ranks included), and the rest of the step outside
rank 0 (the pipe to rank 0, pickling, the relay to the other ranks, the reply).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from runner_decode import Decoder

from sluiceway.runner.loading import load_model
from sluiceway.runner.model_runner import TorchModelRunner
from sluiceway.runner.tensor_parallel import TensorParallelRunner
from sluiceway.runner.tensor_parallel.driver import free_loopback_port
from sluiceway.runner.tensor_parallel.messages import CheckpointSource, RankSpec


def median_ms(values: list[float]) -> float:
    return 1000 * statistics.median(values)


def measure(one: TorchModelRunner, tp: TensorParallelRunner, batch: int, args) -> str:
    ctx = args.prompt + args.rounds * args.steps + 16
    decoders = [Decoder(one, batch, args.prompt, ctx), Decoder(tp, batch, args.prompt, ctx)]
    for dec in decoders:
        dec.step()  # prefill
    one_s: list[float] = []
    tp_s: list[float] = []
    rank0: list[float] = []
    collectives: list[float] = []
    for _ in range(args.rounds):
        for _ in range(args.steps):
            t = time.perf_counter()
            decoders[0].step()
            one_s.append(time.perf_counter() - t)
        for _ in range(args.steps):
            decoders[1].step()
            timing = tp.last_step
            assert timing is not None
            tp_s.append(timing.total)
            rank0.append(timing.rank0)
            collectives.append(timing.collectives)
    outside = [t - r for t, r in zip(tp_s, rank0, strict=True)]
    return (
        f"| {batch} | {median_ms(one_s):.2f} | {median_ms(tp_s):.2f} | {median_ms(rank0):.2f} "
        f"| {median_ms(collectives):.2f} | {median_ms(outside):.2f} |"
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M")
    p.add_argument("--tp", type=int, default=3)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--dtype", default="float32")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    ctx = args.prompt + args.rounds * args.steps + 16
    blocks = max(args.batches) * 2 * (-(-ctx // 16)) + 8
    loaded = load_model(args.model, args.dtype, progress=False)
    one = TorchModelRunner.from_loaded(loaded, block_size=16, num_blocks=blocks)
    spec = RankSpec(
        world_size=args.tp,
        init_method=free_loopback_port(),
        source=CheckpointSource(args.model, args.dtype),
        block_size=16,
        num_blocks=blocks,
        torch_threads=args.threads,
    )
    tp = TensorParallelRunner(spec)
    try:
        print(
            f"{loaded.name}, decode step, ms (median of {args.rounds}x{args.steps}); "
            f"tp={args.tp}, {args.threads} thread(s) per rank and for tp=1, {args.dtype}"
        )
        print("| batch | tp=1 | tp step | rank 0 | in collectives | outside rank 0 |")
        print("|---|---|---|---|---|---|")
        for batch in args.batches:
            print(measure(one, tp, batch, args), flush=True)
    finally:
        tp.close()


if __name__ == "__main__":
    main()
