"""How close one decode row through a model's quantized linears comes to the memory
bandwidth bound, in-process, on a Llama-3.2-1B-shape model with random weights.

    .venv/bin/python benchmarks/decode_bound.py [--quantization int4] [--rows 1,8] \
        [--dtype bfloat16] [--kernels new,old] [--threads 2] [--model-step]

A decode step of one sequence must read every weight once, so it can run no faster
than (bytes read per step) / (memory bandwidth). This builds the step's linears
through `runner.linear.Linear` as the model builds them (16 layers of fused qkv,
o, fused gate/up and down in `--quantization`; the tied 128256-row output head in
int8, as `DecoderModel` keeps it for int4), measures the bandwidth (a torch sum
over a 256 MB tensor on `--threads` threads), and prints for each row count:
milliseconds per step of all linears, the bytes the kernels read, the bound in
tokens/s and the share of it achieved, then the time and GB/s of each kind of
linear. `--kernels` picks the quantized kernels (`new`: the int8-activation
kernels of `native/int8_dot.c`; `old`: the bfloat16/float32-activation ones), so
both show in one run; the two alternate round by round, so load from other work
on a shared machine falls on both alike.

`--model-step` also builds the whole model (`TorchModelRunner` from a random
transformers-style state dict, about 6 GB of memory) and times single-sequence
decode steps end to end with each kernel set, profiling one step to show the time
spent outside the native step (Python, sampling, the head).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import torch

from sluiceway.runner import linear as linear_module
from sluiceway.runner.linear import Int4Weight, Int8Weight, Linear

# Wall-clock seconds, or with `--cpu-clock` (one thread) the CPU seconds of the
# calling thread, which the kernels run on: on a machine shared with other work
# that leaves out the time the thread waits for a core.
clock = time.perf_counter

HIDDEN, INTERMEDIATE, LAYERS = 2048, 8192, 16
HEADS, KV_HEADS, HEAD_DIM, VOCAB = 32, 8, 64, 128256
SHAPES = {  # (out, in) of each linear of a layer, in the order a step runs them
    "qkv": ((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN),
    "o": (HIDDEN, HEADS * HEAD_DIM),
    "gate_up": (2 * INTERMEDIATE, HIDDEN),
    "down": (HIDDEN, INTERMEDIATE),
}


def bandwidth(threads: int) -> float:
    """Bytes per second a torch sum over 256 MB reads (best of 10)."""
    data = torch.ones(64 << 20, dtype=torch.float32)
    data.sum()
    best = float("inf")
    for _ in range(10):
        start = clock()
        data.sum()
        best = min(best, clock() - start)
    return data.numel() * 4 / best


def bytes_read(layer: Linear) -> int:
    """Bytes of the quantized weight the step's kernel streams."""
    q = layer.quantized
    if isinstance(q, Int4Weight):
        n = layer.out_features * layer.in_features
        return n // 2 + (n // q.group_size) * 2 * q.scales_and_offsets.element_size()
    assert isinstance(q, Int8Weight)
    return q.q.numel() + q.scales.numel() * q.scales.element_size()


def build(quantization: str, dtype: torch.dtype, kernels: str) -> dict[str, list[Linear]]:
    """The step's linears with the `kernels` set, each layer its own random weights."""
    linear_module.use_int8_activation_kernels(kernels == "new")
    torch.manual_seed(0)
    layers: dict[str, list[Linear]] = {name: [] for name in (*SHAPES, "head")}
    for _ in range(LAYERS):
        for name, (out_features, in_features) in SHAPES.items():
            weight = (torch.randn(out_features, in_features) * 0.02).to(dtype)
            layers[name].append(Linear(weight, quantization=quantization, quantized_max_rows=64))
    head_quantization = "int8" if quantization == "int4" else quantization
    weight = (torch.randn(VOCAB, HIDDEN) * 0.02).to(dtype)
    layers["head"].append(Linear(weight, quantization=head_quantization, quantized_max_rows=64))
    linear_module.use_int8_activation_kernels(None)
    for group in layers.values():
        for layer in group:
            # The dense copy serves calls above quantized_max_rows only, which this
            # benchmark never makes: dropped so that both kernel sets fit in memory.
            layer.weight = None
    return layers


def step(
    layers: dict[str, list[Linear]], inputs: dict[str, torch.Tensor], timings: dict[str, float]
) -> None:
    """Every linear of one step in the step's order, adding each kind's seconds."""
    for i in range(LAYERS):
        for name in SHAPES:
            start = clock()
            layers[name][i](inputs[name])
            timings[name] += clock() - start
    start = clock()
    layers["head"][0](inputs["head"])
    timings["head"] += clock() - start


def time_linears(
    sets: dict[str, dict[str, list[Linear]]], rows: int, dtype: torch.dtype, rounds: int
):
    """Per kernel set: median seconds per step of each kind of linear."""
    inputs = {name: torch.randn(rows, shape[1]).to(dtype) for name, shape in SHAPES.items()}
    inputs["head"] = torch.randn(rows, HIDDEN).to(dtype)
    samples: dict[str, dict[str, list[float]]] = {
        k: {n: [] for n in (*SHAPES, "head")} for k in sets
    }
    with torch.inference_mode():
        for layers in sets.values():
            step(layers, inputs, {n: 0.0 for n in (*SHAPES, "head")})  # warm-up
        for _ in range(rounds):
            for kernels, layers in sets.items():
                timings = {n: 0.0 for n in (*SHAPES, "head")}
                step(layers, inputs, timings)
                for name, seconds in timings.items():
                    samples[kernels][name].append(seconds)
    return {k: {n: statistics.median(s) for n, s in per.items()} for k, per in samples.items()}


def report_linears(args, dtype: torch.dtype, bw: float) -> None:
    sets = {k: build(args.quantization, dtype, k) for k in args.kernels.split(",")}
    first = next(iter(sets.values()))
    per_kind = {name: sum(bytes_read(layer) for layer in group) for name, group in first.items()}
    total = sum(per_kind.values())
    print(
        f"weights read per step: {total / 1e6:.1f} MB ({args.quantization} layers, "
        f"{'int8' if args.quantization == 'int4' else args.quantization} head); "
        f"bound {bw / total:.1f} tok/s at {bw / 1e9:.1f} GB/s"
    )
    for rows in (int(r) for r in args.rows.split(",")):
        medians = time_linears(sets, rows, dtype, args.rounds)
        for kernels, per in medians.items():
            seconds = sum(per.values())
            share = total / seconds / bw
            print(
                f"rows {rows} {kernels:>3}: {1e3 * seconds:7.2f} ms/step of linears, "
                f"{rows / seconds:6.1f} tok/s, {total / seconds / 1e9:5.1f} GB/s = "
                f"{100 * share:5.1f}% of the bound"
            )
            cells = [
                f"{name} {1e3 * s:6.2f} ms {per_kind[name] / s / 1e9:5.1f} GB/s"
                for name, s in per.items()
            ]
            print("    " + " | ".join(cells))


def random_state_dict(dtype: torch.dtype) -> tuple[object, dict[str, torch.Tensor]]:
    """A Llama-3.2-1B-shape transformers config and random weights in its names."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        rope_theta=500000.0,
    )
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).to(dtype)

    weights = {
        "model.embed_tokens.weight": rand(VOCAB, HIDDEN),
        "model.norm.weight": torch.ones(HIDDEN, dtype=dtype),
    }
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    for i in range(LAYERS):
        at = f"model.layers.{i}."
        weights[at + "self_attn.q_proj.weight"] = rand(q, HIDDEN)
        weights[at + "self_attn.k_proj.weight"] = rand(kv, HIDDEN)
        weights[at + "self_attn.v_proj.weight"] = rand(kv, HIDDEN)
        weights[at + "self_attn.o_proj.weight"] = rand(HIDDEN, q)
        weights[at + "mlp.gate_proj.weight"] = rand(INTERMEDIATE, HIDDEN)
        weights[at + "mlp.up_proj.weight"] = rand(INTERMEDIATE, HIDDEN)
        weights[at + "mlp.down_proj.weight"] = rand(HIDDEN, INTERMEDIATE)
        weights[at + "input_layernorm.weight"] = torch.ones(HIDDEN, dtype=dtype)
        weights[at + "post_attention_layernorm.weight"] = torch.ones(HIDDEN, dtype=dtype)
    return config, weights


class Stopwatch:
    """Wraps a callable, adding the seconds each call takes."""

    def __init__(self, fn):
        self.fn, self.seconds = fn, 0.0

    def __call__(self, *args, **kwargs):
        start = clock()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += clock() - start


def report_model_step(args, dtype: torch.dtype, bw: float) -> None:
    """Single-sequence decode steps of the whole model with each kernel set, one
    model in memory at a time; then where a step's time goes."""
    sys.path.insert(0, str(Path(__file__).parent))
    from runner_decode import Decoder

    def time_steps(dec: Decoder, steps: int) -> list[float]:
        times = []
        for _ in range(steps):
            start = clock()
            dec.step()
            times.append(clock() - start)
        return times

    from sluiceway.runner.model_runner import TorchModelRunner

    prompt, ctx = 32, 32 + 2 * args.steps + 16
    for kernels in args.kernels.split(","):
        config, weights = random_state_dict(dtype)
        linear_module.use_int8_activation_kernels(kernels == "new")
        runner = TorchModelRunner(
            config, weights, dtype=dtype, block_size=16, num_blocks=-(-ctx // 16) + 8,
            quantization=args.quantization,
        )  # fmt: skip
        linear_module.use_int8_activation_kernels(None)
        del weights
        gc.collect()
        model = runner.model
        step_bytes = sum(
            bytes_read(layer)
            for layer_weights in model.layers
            for layer in (
                layer_weights.qkv,
                layer_weights.o,
                layer_weights.gate_up,
                layer_weights.down,
            )
        ) + bytes_read(model.lm_head)
        dec = Decoder(runner, 1, prompt, ctx)
        dec.step()  # prefill
        time_steps(dec, 3)
        fused = model._one_token is not None and model._one_token[1] is not None
        med = statistics.median(time_steps(dec, args.steps))
        print(
            f"model step {kernels:>3}: {1e3 * med:7.2f} ms/step, {1 / med:5.1f} tok/s, "
            f"{step_bytes / med / 1e9:5.1f} GB/s = {100 * step_bytes / med / bw:5.1f}% of the bound "
            f"({step_bytes / 1e6:.0f} MB/step; one-call C step: {'yes' if fused else 'no'})"
        )
        # Where the time goes: the C layer step, the head, the rest (embedding,
        # final norm, sampling, the runner's Python).
        one = model._one_token[1] if fused else None
        head = Stopwatch(model.lm_head)
        model.lm_head = head
        layers = None
        if one is not None:
            layers = Stopwatch(one.run)
            one.run = layers  # type: ignore[method-assign]
        total = sum(time_steps(dec, args.steps))
        inside = head.seconds + (layers.seconds if layers else 0.0)
        print(
            f"    per step: layers {1e3 * (layers.seconds if layers else 0) / args.steps:6.2f} ms | "
            f"head {1e3 * head.seconds / args.steps:6.2f} ms | rest (embedding, norm, sampling, "
            f"Python) {1e3 * (total - inside) / args.steps:5.2f} ms = {100 * (total - inside) / total:4.1f}%"
        )
        del runner, model, dec, one
        gc.collect()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quantization", default="int4", choices=["int4", "int8"])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--rows", default="1,8")
    p.add_argument("--kernels", default="new,old")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--model-step", action="store_true")
    p.add_argument(
        "--cpu-clock", action="store_true", help="time on-CPU seconds (needs --threads 1)"
    )
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.cpu_clock:
        if args.threads != 1:
            p.error("--cpu-clock times the calling thread only: use it with --threads 1")
        global clock
        clock = time.thread_time
    dtype = getattr(torch, args.dtype)
    bw = bandwidth(args.threads)
    print(
        f"{args.dtype}, {torch.get_num_threads()} threads, {'CPU' if args.cpu_clock else 'wall'} clock; bandwidth {bw / 1e9:.1f} GB/s (torch sum over 256 MB)"
    )
    report_linears(args, dtype, bw)
    if args.model_step:
        report_model_step(args, dtype, bw)


if __name__ == "__main__":
    main()
