"""What a quantized model's dense weight copies buy and cost: prefill and decode
step times, and the weights' resident bytes, with and without
`--dense-weight-copies`, in one process, the variants interleaved.

    .venv/bin/python benchmarks/dense_copies.py [--model PATH.gguf] [--prompt 512] \
        [--batch 1,16,64] [--rounds 3]

`--model` defaults to the embedded default model (served on int4 from its own
blocks); a GGUF written by `benchmarks/load_real.py` (e.g.
~/.cache/sluiceway-bench/llama-3.2-1b.Q4_0.gguf) gives a real shape. Each round
prefills one sequence of `--prompt` tokens on each variant in turn, then times
decode steps at each batch size (sequences decoding with a short context), after
one round that warms up. Prints the median of each over the rounds, and each variant's weight bytes (quantized
and dense). The machine is shared: compare variants within one run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from runner_decode import Decoder

from sluiceway.config import EngineConfig, ModelConfig
from sluiceway.model_engine import load_bundle


def _weight_bytes(model) -> tuple[int, int]:
    """(quantized, dense) bytes the model's linears hold."""
    quantized = dense = 0
    linears = [model.lm_head]
    for layer in model.layers:
        linears += [layer.qkv, layer.o, layer.gate_up, layer.down]
    for linear in linears:
        q = linear.quantized
        if q is not None:
            for name in ("q", "scales", "packed", "native", "scales_and_offsets"):
                t = getattr(q, name, None)
                quantized += 0 if t is None else t.numel() * t.element_size()
            quantized += 0 if q.tiled is None else q.tiled.nbytes
        if linear.weight is not None:
            dense += linear.weight.numel() * linear.weight.element_size()
    return quantized, dense


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--batch", default="1,16,64")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    args = p.parse_args()
    batches = [int(b) for b in args.batch.split(",")]
    ctx = args.prompt + args.steps * args.rounds + 32
    blocks = max(max(batches) * 4, -(-ctx // 16)) + 16
    runners = {}
    for name, dense in (("quantized only", False), ("dense copies", True)):
        bundle = load_bundle(
            ModelConfig(model=args.model, quantization="int4", dense_weight_copies=dense),
            EngineConfig(num_kv_blocks=blocks),
            progress=False,
        )
        runners[name] = bundle.runner
        quantized, dense_bytes = _weight_bytes(bundle.runner.model)
        print(f"{name}: linears hold {quantized / 1e6:.0f} MB quantized, {dense_bytes / 1e6:.0f} MB dense")
    results: dict[tuple[str, str], list[float]] = {}
    for round_ in range(args.rounds + 1):  # the first warms up: not counted
        for name, runner in runners.items():
            prefill = Decoder(runner, 1, args.prompt, ctx)
            results.setdefault((name, f"prefill {args.prompt}"), []).append(_timed(prefill.step))
            for batch in batches:
                dec = Decoder(runner, batch, 16, 64)
                dec.step()  # its prompts
                per_step = statistics.median(_timed(dec.step) for _ in range(args.steps))
                results.setdefault((name, f"decode batch {batch}"), []).append(per_step)
        if round_ == 0:
            results.clear()
    print(f"\n| step | {' | '.join(runners)} | ratio |")
    print("|---|" + "---|" * (len(runners) + 1))
    for what in dict.fromkeys(w for _, w in results):
        times = [statistics.median(results[(name, what)]) * 1e3 for name in runners]
        print(f"| {what} | " + " | ".join(f"{t:.1f} ms" for t in times) + f" | {times[0] / times[1]:.2f} |")
    print(f"\ntorch threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
