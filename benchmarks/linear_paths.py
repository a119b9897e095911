"""Time one `Linear` of the default model's shapes on each weight path, in-process.

    .venv/bin/python benchmarks/linear_paths.py [--dtype float32] [--threads 2] [--rows 1,8]

For each shape (the fused gate/up projection, the down projection, the output head)
and each path (unquantized, int8, int4), the median over 7 rounds of 20 calls, at
each row count (the quantized paths serve every call here, whatever
`Linear.quantized_max_rows` would pick, so the row counts where they stop paying
show). It shows whether the quantized paths are faster than the unquantized one
on this CPU and dtype: `--quantization auto` takes them only where the native
kernels serve them (see `runner/quantization_choice.py`). The paths alternate round
by round, so load from other work on a shared machine falls on all of them alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from sluiceway.runner.linear import Linear

SHAPES = ((3072, 576), (576, 1536), (49152, 576))  # gate+up, down, head (out, in)
PATHS = (None, "int8", "int4")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--rows", default="1,8", help="row counts, comma-separated")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    print(f"{args.dtype}, {torch.get_num_threads()} threads; median us per call")
    for out_features, in_features in SHAPES:
        weight = (torch.randn(out_features, in_features) * 0.02).to(dtype)
        layers = {q: Linear(weight, quantization=q, quantized_max_rows=1 << 30) for q in PATHS}
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, in_features).to(dtype)
            times: dict[str | None, list[float]] = {q: [] for q in PATHS}
            with torch.inference_mode():
                for layer in layers.values():
                    layer(x)  # warm-up
                for _ in range(args.rounds):
                    for q, layer in layers.items():
                        start = time.perf_counter()
                        for _ in range(20):
                            layer(x)
                        times[q].append((time.perf_counter() - start) / 20)
            cells = [f"{q or 'none'} {1e6 * statistics.median(t):9.1f}" for q, t in times.items()]
            print(f"{out_features}x{in_features} rows {rows}: " + " | ".join(cells))


if __name__ == "__main__":
    main()
