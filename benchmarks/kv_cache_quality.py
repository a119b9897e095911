"""What an int8 or fp8 KV cache (`--kv-cache-dtype`) changes in the default
model's predictions: perplexity, KL divergence and greedy agreement against the
same model over a cache in its own dtype, on `quantization_quality.py`'s fixed
English text.

    .venv/bin/python benchmarks/kv_cache_quality.py [--dtypes bfloat16,float32] \
        [--kv-cache-dtypes int8,fp8]

The text is scored one token per step, every step a decode step: each token's
attention reads every earlier key and value back from the cache (a prompt
prefilled in one step attends over its own unquantized rows, so it would hide
the cache's rounding). For each model dtype the reference is the same model and
steps over a cache in the model's dtype. Also printed: the bytes a token takes
in the cache (all layers, keys and values), and how many tokens 1 GiB holds.
"""

from __future__ import annotations

import argparse

import torch
from quantization_quality import TEXT, score

from sluiceway.runner.kv_cache import kv_cache_bytes_per_block, kv_cache_format
from sluiceway.runner.loading import load_model
from sluiceway.runner.model_runner import TorchModelRunner


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--kv-cache-dtypes", default="int8,fp8")
    args = p.parse_args()
    print(
        "| model | KV cache | bytes/token | tokens in 1 GiB | perplexity | KL (nats/token) | argmax agrees |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for dtype in args.dtypes.split(","):
        loaded = load_model(None, dtype, progress=False)
        ids = loaded.tokenizer(TEXT)["input_ids"]
        targets = torch.tensor(ids[1:])
        shape = None
        want = None
        for cache in ["auto", *args.kv_cache_dtypes.split(",")]:
            runner = TorchModelRunner.from_loaded(
                loaded, num_blocks=-(-len(ids) // 16) + 2, kv_cache_dtype=cache
            )
            shape = runner.model.shape
            logp = score(runner, ids, 1)
            want = logp if want is None else want
            per_token = kv_cache_bytes_per_block(
                num_layers=shape.num_layers,
                block_size=1,
                num_kv_heads=shape.num_kv_heads,
                head_dim=shape.head_dim,
                format=kv_cache_format(cache, loaded.dtype),
            )
            nll = -logp.gather(1, targets[:, None]).mean()
            kl = (want.exp() * (want - logp)).sum(-1).mean()
            agree = (logp.argmax(-1) == want.argmax(-1)).float().mean()
            print(
                f"| {dtype} | {runner.kv_cache.format.name} | {per_token} | {(1 << 30) // per_token} "
                f"| {nll.exp():.3f} | {kl:.5f} | {100 * agree:.1f}% |"
            )
    print(f"{len(targets)} scored tokens, default model, one decode step per token")


if __name__ == "__main__":
    main()
