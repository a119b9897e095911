"""Time one layer of decode attention (`TorchAttention`, KV-cache write included)
at a short and a long context, in-process, with the default model's heads.

    .venv/bin/python benchmarks/attention_context.py [--dtype float32] [--batch 1,8] \
        [--context 128,4096] [--threads 2]

For each batch, context and path (the native `paged_decode` kernel, and the
gather + SDPA path it replaces): the median ms per layer over `--rounds` rounds
of `--calls` calls, and that times the model's 30 layers, i.e. what attention
adds to a decode step at that context. The contexts and paths of one batch
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
from sluiceway.runner.kv_cache import KVCache
from sluiceway.runner.model_runner import build_inputs

HEADS, KV_HEADS, HEAD_DIM, LAYERS, BLOCK = 9, 3, 64, 30, 16


def _case(batch: int, context: int, dtype: torch.dtype, native: bool):
    blocks_per_seq = -(-context // BLOCK)
    cache = KVCache.allocate(
        num_layers=1,
        num_blocks=batch * blocks_per_seq + 1,
        block_size=BLOCK,
        num_kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        dtype=dtype,
        device="cpu",
    )
    for c in (*cache.key_caches, *cache.value_caches):
        c.normal_()
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
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    print(f"{args.dtype} cache, {torch.get_num_threads()} threads")
    with torch.inference_mode():
        for batch in (int(b) for b in args.batch.split(",")):
            cases = {
                (ctx, native): _case(batch, ctx, dtype, native)
                for ctx in map(int, args.context.split(","))
                for native in (True, False)
            }
            times: dict[tuple[int, bool], list[float]] = {key: [] for key in cases}
            for run in cases.values():
                run()  # warm-up
            for _ in range(args.rounds):
                for key, run in cases.items():
                    start = time.perf_counter()
                    for _ in range(args.calls):
                        run()
                    times[key].append((time.perf_counter() - start) / args.calls)
            for (ctx, native), t in times.items():
                ms = 1000 * statistics.median(t)
                path = "native" if native else "sdpa  "
                print(
                    f"batch {batch:>2} context {ctx:>5} {path}: {ms:8.3f} ms a layer, "
                    f"{LAYERS * ms:8.1f} ms a step"
                )


if __name__ == "__main__":
    main()
