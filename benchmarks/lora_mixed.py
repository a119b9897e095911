"""Multi-LoRA serving on CPU: decode throughput with many adapters in one batch,
and the mixed-batch LoRA matmul's two shapes.

    .venv/bin/python benchmarks/lora_mixed.py [--streams 8,32] [--adapters 1,4,16]
        [--rank 16] [--steps 16] [--dtype auto]
    .venv/bin/python benchmarks/lora_mixed.py --kernels [--rank 16] [--dtype float32]

Throughput: decode steps of the default model (SmolLM2-135M) on its runner,
`--streams` sequences after a 32-token prompt, served by the base model alone or
spread round robin over N random rank-`--rank` adapters on every linear
(q/k/v/o, gate/up/down), written as PEFT directories and loaded as the server
loads them. The configurations take turns step by step, so the shared machine's
noise hits them alike; prints the median step time, tokens/s and the ratio to
the base model's throughput.

`--kernels`: one fused linear's LoRA delta for T rows spread over N adapters, as
the runner computes it (`LoraRows.add_delta`: per adapter, gather its rows, two
small matmuls, index-add back) and as one gathered `bmm` (every row's A and B
gathered by its adapter index, punica's shape); median microseconds per call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from sluiceway.engine.batch import ScheduledChunk, StepBatch
from sluiceway.engine.lora_modules import LoraModules
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.runner.loading import load_model, resolve_dtype
from sluiceway.runner.lora.adapter import LoraAdapter, LoraPair
from sluiceway.runner.lora.rows import LoraRows
from sluiceway.runner.model_runner import TorchModelRunner

PROMPT = 32
TARGETS = {
    "self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
}


def write_adapter(directory: Path, runner: TorchModelRunner, rank: int, seed: int) -> str:
    """A random PEFT adapter of `rank` on every linear of `runner`'s model."""
    s = runner.model.shape
    q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    gate_up = runner.model.layers[0].gate_up
    assert gate_up is not None
    inter = gate_up.out_features // 2
    dims = {
        "q_proj": (s.hidden_size, q),
        "k_proj": (s.hidden_size, kv),
        "v_proj": (s.hidden_size, kv),
        "o_proj": (q, s.hidden_size),
        "gate_proj": (s.hidden_size, inter),
        "up_proj": (s.hidden_size, inter),
        "down_proj": (inter, s.hidden_size),
    }
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(s.num_layers):
        for block, modules in TARGETS.items():
            for module in modules:
                fan_in, fan_out = dims[module]
                name = f"base_model.model.model.layers.{layer}.{block}.{module}"
                tensors[f"{name}.lora_A.weight"] = torch.randn(rank, fan_in, generator=g) * 0.02
                tensors[f"{name}.lora_B.weight"] = torch.randn(fan_out, rank, generator=g) * 0.02
    directory.mkdir(parents=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    targets = [m for modules in TARGETS.values() for m in modules]
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": targets}
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return str(directory)


def decode_batch(streams: int, lora_ids: list[int], position: int, tables: list[list[int]]):
    """One decode step of `streams` sequences at `position`, adapters round robin."""
    return StepBatch(
        chunks=tuple(
            ScheduledChunk(
                seq_id=i,
                token_ids=[100 + i],
                start_pos=position,
                block_table=tables[i],
                sample=True,
                params=SamplingParams(
                    temperature=0.0, lora_id=lora_ids[i % len(lora_ids)] if lora_ids else 0
                ),
            )
            for i in range(streams)
        )
    )


def throughput(args) -> None:
    loaded = load_model(None, args.dtype, progress=False)
    streams = [int(x) for x in args.streams.split(",")]
    counts = [int(x) for x in args.adapters.split(",")]
    ctx = PROMPT + args.steps + 1
    per_seq = -(-ctx // 16)
    runner = TorchModelRunner.from_loaded(
        loaded, block_size=16, num_blocks=max(streams) * per_seq + 1
    )
    tables = [list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)) for i in range(max(streams))]
    with tempfile.TemporaryDirectory() as tmp:
        modules = LoraModules.of(
            {f"a{i}": write_adapter(Path(tmp) / f"a{i}", runner, args.rank, i) for i in range(max(counts))}
        )
        runner.enable_lora(modules, max_loras=max(counts), max_rank=args.rank)
    ids = [m.lora_id for m in modules]
    # One prefill fills every sequence's first PROMPT positions; the configurations
    # then decode over the same blocks (what they hold does not change the time).
    prefill = StepBatch(
        chunks=tuple(
            ScheduledChunk(
                seq_id=i,
                token_ids=list(range(100, 100 + PROMPT)),
                start_pos=0,
                block_table=tables[i],
                sample=True,
                params=SamplingParams(temperature=0.0),
            )
            for i in range(max(streams))
        )
    )
    runner.step(prefill)
    configs = [(s, n) for s in streams for n in [0, *counts]]
    times: dict[tuple[int, int], list[float]] = {c: [] for c in configs}
    for s, n in configs:  # warm-up: each adapter's first use
        runner.step(decode_batch(s, ids[:n], PROMPT, tables))
    for step in range(args.steps):
        for s, n in configs:
            batch = decode_batch(s, ids[:n], PROMPT + step, tables)
            start = time.perf_counter()
            runner.step(batch)
            times[(s, n)].append(time.perf_counter() - start)
    print(
        f"{loaded.dtype}, rank {args.rank} on every linear, {args.steps} decode steps per "
        f"configuration, interleaved, after a {PROMPT}-token prompt"
    )
    print(f"{'streams':>8} {'adapters':>9} {'ms/step':>8} {'tok/s':>8} {'vs base':>8}")
    for s, n in configs:
        median = statistics.median(times[(s, n)])
        base = statistics.median(times[(s, 0)])
        print(f"{s:>8} {n or 'base':>9} {median * 1e3:>8.1f} {s / median:>8.1f} {base / median:>8.2f}")


def kernels(args) -> None:
    dtype = resolve_dtype(args.dtype)
    for fan_in, fan_out in ((576, 960), (2048, 3072)):
        for rows in (8, 32):
            for n in (1, 4, 16):
                adapters = [
                    LoraAdapter(
                        f"a{i}",
                        args.rank,
                        {
                            (0, "qkv"): LoraPair(
                                torch.randn(args.rank, fan_in, dtype=dtype) * 0.02,
                                torch.randn(fan_out, args.rank, dtype=dtype) * 0.02,
                            )
                        },
                    )
                    for i in range(n)
                ]
                # Rows spread round robin over the adapters, one in n+1 on the base model.
                which = [None if r % (n + 1) == n else adapters[r % (n + 1)] for r in range(rows)]
                grouped = LoraRows.of(which, [1] * rows, "cpu")
                assert grouped is not None
                a_stack = torch.stack(
                    [torch.zeros(args.rank, fan_in, dtype=dtype)] + [a.pairs[(0, "qkv")].a for a in adapters]
                )
                b_stack = torch.stack(
                    [torch.zeros(fan_out, args.rank, dtype=dtype)] + [a.pairs[(0, "qkv")].b for a in adapters]
                )
                index = torch.tensor([0 if w is None else adapters.index(w) + 1 for w in which])
                x = torch.randn(rows, fan_in, dtype=dtype)
                y = torch.randn(rows, fan_out, dtype=dtype)

                def loop(grouped=grouped, x=x, y=y):
                    grouped.add_delta(y.clone(), x, 0, "qkv")

                def gathered(x=x, y=y, a_stack=a_stack, b_stack=b_stack, index=index):
                    xa = torch.bmm(x[:, None, :], a_stack[index].transpose(1, 2))
                    _ = y + torch.bmm(xa, b_stack[index].transpose(1, 2))[:, 0]

                times: dict[str, list[float]] = {"loop": [], "bmm": []}
                with torch.inference_mode():
                    for _ in range(args.calls):
                        for name, fn in (("loop", loop), ("bmm", gathered)):
                            t = time.perf_counter()
                            fn()
                            times[name].append(time.perf_counter() - t)
                med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
                print(
                    f"{fan_in}->{fan_out} rows {rows:>2} adapters {n:>2}: "
                    f"grouped loop {med['loop']:7.1f} us, gathered bmm {med['bmm']:7.1f} us"
                )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernels", action="store_true")
    p.add_argument("--streams", default="8,32")
    p.add_argument("--adapters", default="1,4,16")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--dtype", default="auto")
    args = p.parse_args()
    kernels(args) if args.kernels else throughput(args)


if __name__ == "__main__":
    main()
