"""Time CPU decode attention shapes: SDPA with one query per head against the query
heads of a KV head grouped as that head's queries (what `TorchAttention` runs),
and two formulations without SDPA that were tried and dropped: "grouped, bmm" wins
here from 8 sequences on (0.246 vs 0.415 ms at 32), yet made whole decode steps
slower (`benchmarks/runner_ab.py --batch 32 --prompt 128`: x0.92; x1.01 at 8).

    .venv/bin/python benchmarks/attention_decode.py [--batch 32] [--context 160]

Defaults are the default model's heads (9 query heads over 3 KV heads of 64). The
two variants are interleaved in one process and checked to agree.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--context", type=int, default=160)
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=200)
    args = p.parse_args()
    b, h, kvh, length, d = args.batch, args.heads, args.kv_heads, args.context, args.head_dim
    gen = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16
    q = torch.randn(b, h, d, generator=gen).to(dtype)
    # Keys and values as the gather leaves them: [B, L, KVH, D] viewed as [B, KVH, L, D].
    keys = torch.randn(b, length, kvh, d, generator=gen).to(dtype).transpose(1, 2)
    values = torch.randn(b, length, kvh, d, generator=gen).to(dtype).transpose(1, 2)
    mask = torch.zeros(b, 1, 1, length, dtype=dtype)
    mask[: b // 2, ..., length - 7 :] = float("-inf")  # half the rows are shorter

    def per_head() -> torch.Tensor:
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2), keys, values, attn_mask=mask, scale=d**-0.5, enable_gqa=True
        )
        return out.squeeze(2)

    def grouped() -> torch.Tensor:
        out = F.scaled_dot_product_attention(
            q.view(b, kvh, h // kvh, d), keys, values, attn_mask=mask, scale=d**-0.5
        )
        return out.reshape(b, h, d)

    def grouped_matmuls() -> torch.Tensor:
        scores = torch.matmul(q.view(b, kvh, h // kvh, d), keys.transpose(-1, -2))
        scores = scores.float().mul_(d**-0.5).add_(mask)
        return torch.matmul(scores.softmax(-1).to(dtype), values).reshape(b, h, d)

    def grouped_bmm_contiguous() -> torch.Tensor:
        flat_k = keys.contiguous().view(b * kvh, length, d)
        flat_v = values.contiguous().view(b * kvh, length, d)
        scores = torch.bmm(q.view(b * kvh, h // kvh, d), flat_k.transpose(1, 2))
        scores = scores.view(b, kvh, h // kvh, length).float().mul_(d**-0.5).add_(mask)
        probs = scores.softmax(-1).to(dtype).view(b * kvh, h // kvh, length)
        return torch.bmm(probs, flat_v).reshape(b, h, d)

    variants = {
        "one query per head": per_head,
        "grouped by KV head": grouped,
        "grouped, two matmuls": grouped_matmuls,
        "grouped, bmm": grouped_bmm_contiguous,
    }
    with torch.inference_mode():
        reference = per_head().float()
        diff = max((fn().float() - reference).abs().max().item() for fn in variants.values())
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.repeats):
            for name, fn in variants.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    print(f"batch {b}, context {length}, {h} heads over {kvh}, bf16; max |difference| {diff:.2e}")
    for name, samples in times.items():
        print(f"  {name:20s} median {statistics.median(samples) * 1e3:7.3f} ms")


if __name__ == "__main__":
    main()
