"""Tensor-parallel decode on the device (run by gpu_check.sh, section c).

The Llama-3-8B shape of gpu_check.py (random bf16 weights, ~512 tokens of
context a sequence), one decode step with sampling, timed two ways at each
batch size: `TorchModelRunner` on one GPU (the tp=1 row), and
`TensorParallelRunner` over N GPUs (NCCL; N = 8, 4 or 2, the most that the
GPUs allow and the 8 KV heads divide). The ranks get the weights through CUDA
IPC from GPU 0 and each keeps its slice on its own GPU. On a machine with one
GPU only the tp=1 row is measured, and the table says why.

`--smoke` runs the same code on CPU (gloo, two ranks) with a tiny model.
Needs torch and transformers; not trio, hypercorn or the engine loop.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from gpu_check import LLAMA3_8B, TINY, build_hf  # noqa: E402

from sluiceway.engine.batch import ScheduledChunk, StepBatch  # noqa: E402
from sluiceway.engine.sampling_params import SamplingParams  # noqa: E402


def decode_batch(batch: int, context: int, block_size: int, vocab: int) -> tuple[StepBatch, int]:
    """`batch` sequences of one new token at position `context` each (0 .. context-1
    count as cached, in shuffled blocks), and the blocks they need."""
    per_seq = -(-(context + 1) // block_size)
    blocks = batch * per_seq + 1
    tables = (torch.randperm(blocks - 1) + 1).view(batch, per_seq).tolist()
    ids = torch.randint(0, vocab, (batch,)).tolist()
    greedy = SamplingParams(temperature=0.0, max_tokens=None)
    chunks = tuple(
        ScheduledChunk(seq_id=b, token_ids=[ids[b]], start_pos=context,
                       block_table=tables[b], sample=True, params=greedy)
        for b in range(batch)
    )  # fmt: skip
    return StepBatch(chunks), blocks


def ms_per_step(runner, batch: StepBatch, iters: int, sync) -> float:
    for _ in range(3):
        runner.step(batch)
    times = []
    for _ in range(iters):
        sync()
        t = time.perf_counter()
        runner.step(batch)  # returns host tokens: the step is done
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def tp_size(gpus: int, kv_heads: int) -> int:
    return max((n for n in (8, 4, 2) if n <= gpus and kv_heads % n == 0), default=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model, CPU, gloo")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    from sluiceway.runner.model_runner import TorchModelRunner
    from sluiceway.runner.tensor_parallel import TensorParallelRunner
    from sluiceway.runner.tensor_parallel.driver import free_loopback_port
    from sluiceway.runner.tensor_parallel.messages import RankSpec, WeightsSource

    cuda = torch.cuda.is_available() and not args.smoke
    device = torch.device("cuda:0" if cuda else "cpu")
    gpus = torch.cuda.device_count() if cuda else 0
    cfg = TINY if args.smoke else LLAMA3_8B
    size = 2 if args.smoke else tp_size(gpus, cfg["num_key_value_heads"])
    dtype = torch.bfloat16 if cuda else torch.float32
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    config, hf_model = build_hf(cfg, dtype, device)
    state = hf_model.state_dict()
    batches = {b: decode_batch(b, args.context, args.block_size, cfg["vocab_size"]) for b in args.batches}
    blocks = max(n for _, n in batches.values())
    one = TorchModelRunner(
        config, state, dtype=dtype, device=device, block_size=args.block_size,
        num_blocks=blocks, cuda_graphs=False,
    )  # fmt: skip
    rows = {b: [ms_per_step(one, batch, args.iters, sync)] for b, (batch, _) in batches.items()}
    del one
    if cuda:
        torch.cuda.empty_cache()  # its fused copies; the ranks need GPU 0 too
    note = ""
    if size > 1:
        spec = RankSpec(
            world_size=size, init_method=free_loopback_port(),
            source=WeightsSource(config, state, dtype), device="cuda" if cuda else "cpu",
            block_size=args.block_size, num_blocks=blocks, torch_threads=None if cuda else 1,
        )  # fmt: skip
        tp = TensorParallelRunner(spec)
        try:
            for b, (batch, _) in batches.items():
                rows[b].append(ms_per_step(tp, batch, args.iters, lambda: None))
        finally:
            tp.close()
    else:
        note = f"tp>1 not measured: this machine has {gpus} GPU(s); tensor parallelism needs 2 or more"
    print()
    print(f"decode step with sampling, ms (median of {args.iters}), {dtype}, "
          f"context {args.context}, eager; tp={size} over {'NCCL' if cuda else 'gloo'}")  # fmt: skip
    print(" | ".join(f"{h:>10}" for h in ("batch", "tp=1", f"tp={size}" if size > 1 else "tp>1")))
    for b, times in rows.items():
        cells = [f"{b:>10}", *(f"{t:>10.2f}" for t in times)]
        print(" | ".join(cells + [f"{'n/a':>10}"] * (3 - len(cells))))
    if note:
        print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
