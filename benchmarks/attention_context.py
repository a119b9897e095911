"""Time one layer of decode attention (`TorchAttention`, KV-cache write included)
at a short and a long context, in-process, with the default model's heads.

    .venv/bin/python benchmarks/attention_context.py [--dtype float32] [--batch 1,8] \
        [--context 128,4096] [--threads 2] [--kv-cache-dtypes auto,int8,fp8] [--paths native]

For each batch, context, KV cache dtype and path (the native `paged_decode`
kernel, and the gather + SDPA path it replaces): the median ms per layer over
`--rounds` rounds of `--calls` calls, and that times the model's 30 layers, i.e.
what attention adds to a decode step at that context. The cases of one batch
alternate round by round, so load from other work falls on all alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from sluiceway.engine.batch import ScheduledChunk
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.runner.attention import TorchAttention
from sluiceway.runner.kv_cache import KV_CACHE_DTYPES, KVCache, kv_cache_format
from sluiceway.runner.model_runner import build_inputs

HEADS, KV_HEADS, HEAD_DIM, LAYERS, BLOCK = 9, 3, 64, 30, 16


def _case(batch: int, context: int, dtype: torch.dtype, native: bool, cache_dtype: str):
    blocks_per_seq = -(-context // BLOCK)
    cache = KVCache.allocate(
        num_layers=1,
        num_blocks=batch * blocks_per_seq + 1,
        block_size=BLOCK,
        num_kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        dtype=dtype,
        device="cpu",
        format=kv_cache_format(cache_dtype, dtype),
    )
    slots = torch.arange(cache.num_blocks * BLOCK)
    rows = torch.randn(len(slots), KV_HEADS, HEAD_DIM)
    cache.write(0, slots, rows, rows)
    # Scattered blocks, as a long-running server's are: sequence i holds every
    # batch-th block.
    chunks = [
        ScheduledChunk(
            seq_id=i,
            token_ids=(7,),
            start_pos=context - 1,
            block_table=[1 + i + batch * j for j in range(blocks_per_seq)],
            sample=True,
            params=SamplingParams(),
        )
        for i in range(batch)
    ]
    attention = TorchAttention(cache, native_decode=native)
    meta = attention.prepare(build_inputs(chunks, BLOCK, HEAD_DIM**-0.5, "cpu").meta)
    q = torch.randn(batch, HEADS, HEAD_DIM, dtype=dtype)
    k = torch.randn(batch, KV_HEADS, HEAD_DIM, dtype=dtype)
    return lambda: attention.forward(0, q, k, k, meta)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--batch", default="1,8")
    p.add_argument("--context", default="128,4096")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--kv-cache-dtypes", default="auto", help=f"of {', '.join(KV_CACHE_DTYPES)}")
    p.add_argument("--paths", default="native,sdpa")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    caches = args.kv_cache_dtypes.split(",")
    natives = [path == "native" for path in args.paths.split(",")]
    print(f"{args.dtype} queries, {torch.get_num_threads()} threads")
    with torch.inference_mode():
        for batch in (int(b) for b in args.batch.split(",")):
            cases = {
                (ctx, native, cache): _case(batch, ctx, dtype, native, cache)
                for ctx in map(int, args.context.split(","))
                for cache in caches
                for native in natives
            }
            times: dict[tuple[int, bool, str], list[float]] = {key: [] for key in cases}
            for run in cases.values():
                run()  # warm-up
            for _ in range(args.rounds):
                for key, run in cases.items():
                    start = time.perf_counter()
                    for _ in range(args.calls):
                        run()
                    times[key].append((time.perf_counter() - start) / args.calls)
            for (ctx, native, cache), t in times.items():
                ms = 1000 * statistics.median(t)
                path = "native" if native else "sdpa  "
                name = kv_cache_format(cache, dtype).name
                print(
                    f"batch {batch:>2} context {ctx:>5} {name:>8} cache {path}: {ms:8.3f} ms a layer, "
                    f"{LAYERS * ms:8.1f} ms a step"
                )


if __name__ == "__main__":
    main()
