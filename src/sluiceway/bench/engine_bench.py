"""`sluiceway bench engine`: in-process throughput against a plain transformers loop.

Both sides generate the same number of tokens for the same random prompts at the
same batch size; the figure is output tokens per second of wall time, prefill
included, as a client would see it.
"""

from __future__ import annotations

import argparse
import inspect
import random
import time
from typing import Any

import attrs

from sluiceway.config import EngineConfig
from sluiceway.engine.core import EngineCore
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.flags import model_config


@attrs.frozen
class BenchRow:
    dtype: str
    batch: int
    engine_tok_s: float
    transformers_tok_s: float | None

    @property
    def ratio(self) -> float | None:
        if not self.transformers_tok_s:
            return None
        return self.engine_tok_s / self.transformers_tok_s


def random_prompts(count: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab - 100) for _ in range(length)] for _ in range(count)]


def time_engine(core: EngineCore, prompts: list[list[int]], output_tokens: int) -> float:
    params = SamplingParams(max_tokens=output_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        core.add_request(time.perf_counter_ns() + i, prompt, params)
    produced = 0
    while core.has_work():
        produced += len(core.step())
    elapsed = time.perf_counter() - start
    return produced / elapsed


def time_transformers(module: Any, prompts: list[list[int]], output_tokens: int) -> float:
    """A static-batch greedy loop over transformers' forward with its KV cache, on
    the module's device."""
    import torch

    device = next(module.parameters()).device
    ids = torch.tensor(prompts, device=device)
    # transformers 5 renamed `past_key_values` to `cache` (the old name warns).
    cache_arg = "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"
    start = time.perf_counter()
    with torch.inference_mode():
        out = module(input_ids=ids, use_cache=True)
        for _ in range(output_tokens - 1):
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            out = module(input_ids=nxt, use_cache=True, **{cache_arg: out[cache_arg]})
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    return len(prompts) * output_tokens / elapsed


def run_engine_bench(args: argparse.Namespace) -> int:
    """Entry point of `sluiceway bench engine`. The engine is built the way the
    server builds it (`load_bundle`: device, attention backend, quantization,
    decode graphs), on this thread, which also runs every step."""
    from sluiceway.model_engine import build_core, load_bundle

    batches = [int(b) for b in args.batch_sizes.split(",")]
    rows: list[BenchRow] = []
    for dtype in args.dtypes.split(","):
        config = EngineConfig(
            max_num_seqs=max(batches),
            max_num_batched_tokens=max(2048, max(batches) * args.prompt_tokens),
        )
        blocks_per_seq = -(-(args.prompt_tokens + args.output_tokens) // config.block_size)
        config = attrs.evolve(config, num_kv_blocks=max(batches) * blocks_per_seq + 8)
        bundle = load_bundle(
            attrs.evolve(model_config(args), dtype=dtype),
            config,
            progress=False,
            keep_module=not args.skip_transformers,
        )
        core = build_core(bundle, config)
        print(f"{dtype}: {bundle.quantization or 'unquantized'} weights", flush=True)
        module = bundle.loaded.module
        if module is not None:
            module = module.to(bundle.runner.device)
        vocab = bundle.loaded.hf_config.vocab_size
        time_engine(core, random_prompts(2, args.prompt_tokens, vocab, 99), 4)  # warm-up
        for batch in batches:
            prompts = random_prompts(batch, args.prompt_tokens, vocab, batch)
            ours = time_engine(core, prompts, args.output_tokens)
            theirs = None
            if module is not None:
                theirs = time_transformers(module, prompts, args.output_tokens)
            row = BenchRow(dtype, batch, ours, theirs)
            rows.append(row)
            print(_format_row(row), flush=True)
        close = getattr(bundle.runner, "close", None)
        if close is not None:  # tensor-parallel ranks: end them before the next dtype's
            close()
    print()
    print(format_table(rows, args))
    return 0


def _format_row(row: BenchRow) -> str:
    theirs = f"{row.transformers_tok_s:12.1f}" if row.transformers_tok_s else f"{'-':>12}"
    ratio = f"{row.ratio:5.2f}x" if row.ratio else "     -"
    return f"| {row.dtype:<8} | {row.batch:>5} | {row.engine_tok_s:9.1f} | {theirs} | {ratio} |"


def format_table(rows: list[BenchRow], args: argparse.Namespace) -> str:
    head = (
        f"decode throughput, output tok/s ({args.prompt_tokens} prompt + "
        f"{args.output_tokens} output tokens per sequence, greedy)\n"
        "| dtype    | batch | sluiceway | transformers | ratio |\n"
        "|----------|-------|-----------|--------------|-------|"
    )
    return "\n".join([head, *(_format_row(r) for r in rows)])
