"""Decode steps of every registered model family at one size, in-process, with the
paths each one took, so a family that falls off the fast paths shows.

    .venv/bin/python benchmarks/family_decode.py [--families llama,gemma2] \
        [--dtype bfloat16] [--quantization int4] [--batch 1,8] [--steps 20]

Each family gets a random-weight model of the same shape (`SHAPE`, about 30M
parameters with the embeddings) built from its transformers config, then
`runner_decode.Decoder` prefills `--prompt` tokens per sequence and times
`--steps` decode steps per batch size (median ms per step, tok/s). The path
columns say, per family: whether batch-1 steps ran as one fused C call, which
layer ops ran (C kernels or torch), whether RoPE was fused with the cache store,
how decode attention ran, and which layers needed masked attention (sliding
windows narrower than the context, soft caps). The machine is shared: compare
families within one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).parent))
from runner_decode import Decoder, time_steps

from sluiceway.runner.model_runner import TorchModelRunner
from sluiceway.runner.models.registry import FAMILIES
from sluiceway.runner.native.layer_ops import NativeLayerOps

SHAPE = dict(
    vocab_size=8192,
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=6,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=4096,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
# What each model type's released configs set beyond the shape (windows as the
# released models have them, so that short contexts stay within them).
EXTRA: dict[str, dict] = {
    "mistral": dict(sliding_window=4096),
    "phi3": dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.75)),
    "smollm3": dict(no_rope_layers=[1, 1, 1, 0, 1, 1]),
    "qwen3_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=384),
    "mixtral": dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=384),
    "gemma2": dict(sliding_window=4096),
    "gemma3_text": dict(sliding_window=512),
}


def build(model_type: str, dtype: torch.dtype, quantization: str | None, blocks: int):
    config = transformers.AutoConfig.for_model(model_type, **{**SHAPE, **EXTRA.get(model_type, {})})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    return TorchModelRunner(
        config,
        model.state_dict(),
        dtype=dtype,
        block_size=16,
        num_blocks=blocks,
        quantization=quantization,
    )


def paths(runner: TorchModelRunner, ctx: int) -> dict[str, str]:
    model = runner.model
    arch = model.architecture
    one_token = model._one_token is not None and model._one_token[1] is not None
    native_ops = isinstance(model.ops, NativeLayerOps)
    masked = [i for i in range(arch.shape.num_layers) if arch.needs_masked_attention(i, ctx)]
    return {
        "one-call C step": "yes" if one_token else "no",
        # Gemma's norms and GELU MLP have no C kernels: they run in torch.
        "layer ops": "C" if native_ops and not arch.gemma_norms else "torch",
        "fused RoPE": "yes" if native_ops and arch.llama_layers else "no",
        "decode attention": "C kernel" if getattr(runner.attention, "native_decode", False) else "SDPA",
        "masked layers": ",".join(map(str, masked)) or "-",
    }


def main() -> None:
    p = argparse.ArgumentParser()
    types = [t for family in FAMILIES for t in family.model_types]
    p.add_argument("--families", default=",".join(types), help="model types, comma-separated")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--quantization", default=None)
    p.add_argument("--batch", default="1,8", help="batch sizes, comma-separated")
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    batches = [int(b) for b in args.batch.split(",")]
    ctx = args.prompt + 2 * args.steps + 16
    blocks = max(batches) * -(-ctx // 16) + 8
    rows = []
    for model_type in args.families.split(","):
        runner = build(model_type, dtype, args.quantization, blocks)
        timings = []
        for batch in batches:
            dec = Decoder(runner, batch, args.prompt, ctx)
            dec.step()  # prefill
            time_steps(dec, 2)  # warm-up
            med = statistics.median(time_steps(dec, args.steps))
            timings.append(f"b{batch} {1000 * med:7.2f} ms {batch / med:6.0f} tok/s")
        rows.append((model_type, timings, paths(runner, args.prompt + args.steps)))
    header = list(rows[0][2])
    print(f"{args.dtype}, quantization {args.quantization}, prompt {args.prompt}, {args.steps} steps")
    print(" | ".join(["family", *(f"batch {b}" for b in batches), *header]))
    for model_type, timings, used in rows:
        print(" | ".join([model_type, *timings, *used.values()]))


if __name__ == "__main__":
    main()
