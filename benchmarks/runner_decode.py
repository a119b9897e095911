"""Time and profile TorchModelRunner steps on the default model, in-process.

    .venv/bin/python benchmarks/runner_decode.py --batch 32 --dtype bfloat16 [--profile] \
        [--kv-cache-dtype int8]

Builds one runner, prefills `--batch` random prompts of `--prompt` tokens in one
step, then times `--steps` decode steps (median ms per step and tok/s). With
`--profile` prints the torch.profiler op table for a few decode steps. The machine
is shared, so compare variants inside one process (see `ab()`), interleaved.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from sluiceway.engine.batch import ScheduledChunk, StepBatch
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.runner.loading import load_model
from sluiceway.runner.model_runner import TorchModelRunner

GREEDY = SamplingParams(temperature=0.0, max_tokens=None)


def build(dtype: str, batch: int, ctx: int, **kwargs) -> tuple[TorchModelRunner, object]:
    loaded = load_model(None, dtype, progress=False)
    blocks = batch * (-(-ctx // 16)) + 8
    runner = TorchModelRunner.from_loaded(loaded, block_size=16, num_blocks=blocks, **kwargs)
    return runner, loaded


class Decoder:
    """Drives `batch` sequences: one prefill step, then decode steps."""

    def __init__(self, runner: TorchModelRunner, batch: int, prompt: int, ctx: int, seed=0):
        rng = random.Random(seed)
        per_seq = -(-ctx // runner.block_size)
        self.runner = runner
        self.tables = [list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)) for i in range(batch)]
        top = min(40000, runner.model.shape.vocab_size)
        self.tokens = [[rng.randrange(100, top) for _ in range(prompt)] for _ in range(batch)]
        self.done = [0] * batch

    def step(self) -> None:
        chunks = tuple(
            ScheduledChunk(
                seq_id=i,
                token_ids=toks[self.done[i] :],
                start_pos=self.done[i],
                block_table=self.tables[i],
                sample=True,
                params=GREEDY,
            )
            for i, toks in enumerate(self.tokens)
        )
        for s in self.runner.step(StepBatch(chunks=chunks)):
            self.done[s.seq_id] = len(self.tokens[s.seq_id])
            self.tokens[s.seq_id].append(s.token_id)


def time_steps(dec: Decoder, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        dec.step()
        times.append(time.perf_counter() - t)
    return times


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--quantization", default=None)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--kv-cache-dtype", default="auto")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ctx = args.prompt + args.steps + 16
    kwargs: dict[str, str] = {"kv_cache_dtype": args.kv_cache_dtype}
    if args.quantization:
        kwargs["quantization"] = args.quantization
    runner, _ = build(args.dtype, args.batch, ctx, **kwargs)
    dec = Decoder(runner, args.batch, args.prompt, ctx)
    t = time.perf_counter()
    dec.step()
    print(f"prefill {args.batch}x{args.prompt}: {1000 * (time.perf_counter() - t):.1f} ms")
    times = time_steps(dec, args.steps)
    med = statistics.median(times)
    print(f"decode median {1000 * med:.2f} ms/step, {args.batch / med:.0f} tok/s")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            time_steps(dec, 5)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


if __name__ == "__main__":
    main()
