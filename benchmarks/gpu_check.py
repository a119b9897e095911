"""Device check for the triton paged-attention kernels (run by gpu_check.sh).

1. `--kernels-only`: a small inline correctness check of the kernels against a
   torch reference (used when pytest is missing on the device).
2. Otherwise: decode throughput of a Llama-3-8B-shaped random-weight bf16 model
   (32 layers, hidden 4096, 32 heads, 8 kv heads, intermediate 14336, vocab 128256)
   at several batch sizes with ~512 tokens of context each, three ways: the
   sluiceway runner's forward (`build_inputs` + `DecoderModel` with `TritonAttention`,
   eagerly, and through the runner's `DecodeGraphs`: inputs copied into static
   buffers, then a CUDA graph replay), a plain transformers `LlamaForCausalLM`
   forward loop over a static KV cache, and the memory-bandwidth bound (weight
   bytes per step / measured device-to-device copy bandwidth). Prints one table,
   with the largest difference between the graph's and the eager logits.

Needs torch, triton and transformers; not trio, hypercorn or the engine. `--smoke`
runs the same code paths on a tiny model on CPU under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

LLAMA3_8B = dict(
    num_hidden_layers=32,
    hidden_size=4096,
    num_attention_heads=32,
    num_key_value_heads=8,
    intermediate_size=14336,
    vocab_size=128256,
    rope_theta=500000.0,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
TINY = dict(LLAMA3_8B, num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=256, vocab_size=512)  # fmt: skip


class Timer:
    """Milliseconds per call of `fn`: CUDA events on a GPU, perf_counter elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self, fn, iters: int, warmup: int = 3) -> float:
        for _ in range(warmup):
            fn()
        if not self.cuda:
            start = time.perf_counter()
            for _ in range(iters):
                fn()
            return (time.perf_counter() - start) * 1e3 / iters
        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / iters


def copy_bandwidth(device: torch.device, timer: Timer) -> float:
    """Device-to-device copy rate in bytes/s, counting bytes read plus bytes written."""
    n = (1 << 30) if device.type == "cuda" else (1 << 24)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src), iters=20)
    return 2 * n / (ms / 1e3)


# ---------------------------------------------------------------- correctness
def reference_attention(q, kc, vc, tables, seq_lens, q_lens, scale):
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    bs, group = kc.shape[1], q.shape[1] // kc.shape[2]
    start = 0
    for b, (n, ql) in enumerate(zip(seq_lens, q_lens, strict=True)):
        pos = torch.arange(n, device=q.device)
        blocks = tables[b].long()[pos // bs]
        k = kc[blocks, pos % bs].float().repeat_interleave(group, 1)
        v = vc[blocks, pos % bs].float().repeat_interleave(group, 1)
        qq = q[start : start + ql].float()
        s = torch.einsum("qhd,khd->hqk", qq, k) * scale
        visible = pos[None, :] <= torch.arange(n - ql, n, device=q.device)[:, None]
        p = s.masked_fill(~visible, float("-inf")).softmax(-1)
        out[start : start + ql] = torch.einsum("hqk,khd->qhd", p, v)
        start += ql
    return out


def check_kernels(device: torch.device) -> bool:
    from sluiceway.runner.kernels import (
        paged_attention_decode,
        paged_attention_prefill,
        write_kv_cache,
    )

    gen = torch.Generator().manual_seed(0)
    ok = True
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 5e-2), (torch.float16, 1e-2)):
        for bs, kvh, group, dim in ((16, 2, 1, 64), (32, 8, 4, 128), (16, 1, 3, 64)):
            seq_lens, q_lens = [1, bs, bs + 1, 77, 130], [1, bs, 5, 1, 64]
            nblk = sum(-(-n // bs) for n in seq_lens) + 1
            order = (torch.randperm(nblk - 1, generator=gen) + 1).tolist()
            width = max(-(-n // bs) for n in seq_lens)
            tables = torch.zeros(len(seq_lens), width, dtype=torch.int32)
            taken = 0
            for i, n in enumerate(seq_lens):
                tables[i, : -(-n // bs)] = torch.tensor(order[taken : taken + -(-n // bs)])
                taken += -(-n // bs)
            slots = torch.tensor(
                [
                    int(tables[i, p // bs]) * bs + p % bs
                    for i, n in enumerate(seq_lens)
                    for p in range(n)
                ]
            )
            total = len(slots)
            kc = torch.zeros(nblk, bs, kvh, dim, dtype=dtype, device=device)
            vc = torch.zeros_like(kc)
            k = torch.randn(total, kvh, dim, generator=gen).to(dtype).to(device)
            v = torch.randn(total, kvh, dim, generator=gen).to(dtype).to(device)
            write_kv_cache(k, v, kc, vc, slots.to(device))
            tables_d = tables.to(device)
            lens_d = torch.tensor(seq_lens, dtype=torch.int32, device=device)
            q = torch.randn(sum(q_lens), kvh * group, dim, generator=gen).to(dtype).to(device)
            qsl = torch.tensor(
                [0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=device
            )
            scale = dim**-0.5
            out = paged_attention_prefill(q, kc, vc, tables_d, lens_d, qsl, scale, max(q_lens))
            ref = reference_attention(q, kc, vc, tables_d, seq_lens, q_lens, scale)
            err = (out.float() - ref).abs().max().item()
            qd = torch.randn(len(seq_lens), kvh * group, dim, generator=gen).to(dtype).to(device)
            outd = paged_attention_decode(qd, kc, vc, tables_d, lens_d, scale)
            refd = reference_attention(qd, kc, vc, tables_d, seq_lens, [1] * len(seq_lens), scale)
            errd = (outd.float() - refd).abs().max().item()
            good = err < tol and errd < tol
            ok &= good
            print(f"check {dtype!s:15} bs={bs} kvh={kvh} g={group} d={dim}: "
                  f"prefill err {err:.2e}, decode err {errd:.2e} {'ok' if good else 'FAIL'}")  # fmt: skip
    return ok


# ---------------------------------------------------------------- models
def build_hf(cfg: dict, dtype: torch.dtype, device: torch.device):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**cfg)
    config._attn_implementation = "sdpa"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return config, model.eval()


class OursDecode:
    """One decode step of the sluiceway runner's model with TritonAttention over a
    paged cache: `batch` sequences, each `context` tokens cached in shuffled blocks.
    `step` is the runner's eager path; `graph_step` goes through `DecodeGraphs`
    (captured on CUDA; elsewhere the same static buffers run eagerly)."""

    def __init__(self, config, hf_model, dtype, device, batch: int, context: int, block_size: int):
        from sluiceway.engine.batch import ScheduledChunk
        from sluiceway.engine.sampling_params import SamplingParams
        from sluiceway.runner.kernels.backend import TritonAttention
        from sluiceway.runner.kv_cache import KVCache
        from sluiceway.runner.model_runner import build_inputs
        from sluiceway.runner.models.decoder import DecoderModel

        self.model = getattr(hf_model, "_sluiceway_model", None)
        if self.model is None:
            self.model = DecoderModel.from_checkpoint(config, hf_model.state_dict(), dtype=dtype, device=device)
            hf_model._sluiceway_model = self.model
        shape = self.model.shape
        per_seq = -(-(context + 1) // block_size)
        num_blocks = batch * per_seq + 1
        self.kv_cache = KVCache.allocate(
            num_layers=shape.num_layers, num_blocks=num_blocks, block_size=block_size,
            num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim, dtype=dtype, device=device,
        )  # fmt: skip
        self.attention = TritonAttention(self.kv_cache)
        self.device, self.block_size, self.per_seq = device, block_size, per_seq
        self.build_inputs = build_inputs
        tables = (torch.randperm(num_blocks - 1) + 1).view(batch, per_seq).tolist()
        ids = torch.randint(0, shape.vocab_size, (batch,)).tolist()
        greedy = SamplingParams(temperature=0.0, max_tokens=None)
        # The new token sits at position `context`; 0 .. context-1 count as cached.
        self.chunks = tuple(
            ScheduledChunk(seq_id=b, token_ids=[ids[b]], start_pos=context,
                           block_table=tables[b], sample=True, params=greedy)
            for b in range(batch)
        )  # fmt: skip
        self.graphs = None

    def step(self):
        inputs = self.build_inputs(
            self.chunks, self.block_size, self.model.shape.scale, self.device
        )
        meta = self.attention.prepare(inputs.meta)
        return self.model.forward(
            inputs.input_ids, inputs.positions, self.attention, meta, inputs.logits_indices
        )

    def graph_step(self):
        """Build (and on CUDA capture) the bucket of exactly this batch; return the step."""
        from sluiceway.runner.decode_graphs import DecodeGraphs

        graphs = DecodeGraphs(
            self.model,
            self.attention,
            batch_sizes=(len(self.chunks),),
            max_blocks_per_seq=self.per_seq,
        )
        if self.device.type == "cuda":
            graphs.capture()
        self.graphs = graphs
        return lambda: graphs.run(self.chunks)

    def graph_error(self) -> float:
        """Largest |graph - eager| logit (both write the same KV, so the order is free)."""
        assert self.graphs is not None
        graph = self.graphs.run(self.chunks).clone()
        return (graph - self.step()).abs().max().item()


def hf_decode_step(config, hf_model, dtype, device, batch: int, context: int, steps: int):
    """A step function for transformers' own decode at positions context, context+1, ..."""
    from transformers import StaticCache

    max_len = context + steps + 8
    try:
        cache = StaticCache(config=config, max_cache_len=max_len)
        kind = "static"
    except TypeError:  # transformers 4.x
        cache = StaticCache(
            config=config, max_batch_size=batch, max_cache_len=max_len, device=device, dtype=dtype
        )
        kind = "static"
    ids = torch.randint(0, config.vocab_size, (batch, 1), device=device)
    state = {"pos": context}

    def step():
        pos = state["pos"]
        state["pos"] = min(pos + 1, max_len - 1)
        cache_position = torch.tensor([pos], device=device)
        return hf_model(
            input_ids=ids,
            past_key_values=cache,
            cache_position=cache_position,
            position_ids=cache_position.expand(batch, 1),
            use_cache=True,
        ).logits

    return step, kind, cache


def benchmark(args, device: torch.device) -> None:
    dtype = torch.bfloat16
    timer = Timer(device)
    cfg = TINY if args.smoke else LLAMA3_8B
    bandwidth = copy_bandwidth(device, timer)
    t0 = time.perf_counter()
    config, hf_model = build_hf(cfg, dtype, device)
    weight_bytes = sum(p.numel() * p.element_size() for p in hf_model.parameters())
    print(f"model: {sum(p.numel() for p in hf_model.parameters()) / 1e9:.2f} B params, "
          f"{weight_bytes / 1e9:.1f} GB bf16, built in {time.perf_counter() - t0:.1f} s; "
          f"copy bandwidth {bandwidth / 1e12:.2f} TB/s (read+write)", flush=True)  # fmt: skip
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    kv_per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 2
    rows = []
    with torch.inference_mode():
        for batch in args.batches:
            row = {"batch": batch}
            kv_bytes = batch * (args.context + 1) * kv_per_token
            row["bound"] = batch / (weight_bytes / bandwidth)
            row["bound_kv"] = batch / ((weight_bytes + kv_bytes) / bandwidth)
            try:
                ours = OursDecode(
                    config, hf_model, dtype, device, batch, args.context, args.block_size
                )
                row["ours"] = batch / (timer(ours.step, args.iters) / 1e3)
                row["graph"] = batch / (timer(ours.graph_step(), args.iters) / 1e3)
                row["graph_err"] = ours.graph_error()
                del ours
            except Exception:
                traceback.print_exc()
            try:
                step, row["hf_cache"], cache = hf_decode_step(
                    config, hf_model, dtype, device, batch, args.context, args.iters + 4
                )
                row["hf"] = batch / (timer(step, args.iters) / 1e3)
                del step, cache
            except Exception:
                traceback.print_exc()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            rows.append(row)
            print(f"done batch {batch}: {row}", flush=True)
    print_table(rows, args)


def print_table(rows, args) -> None:
    def fmt(row, key):
        if key not in row:
            return f"{'n/a':>12}"
        return f"{row[key]:>12.2e}" if key == "graph_err" else f"{row[key]:>12.1f}"

    print()
    print(f"decode tokens/s, bf16, context {args.context}, block size {args.block_size}")
    head = ("batch", "triton eager", "triton graph", "HF static", "bound(wts)", "bound(w+kv)",
            "graph err")  # fmt: skip
    print(" | ".join(f"{h:>12}" for h in head))
    for row in rows:
        cells = [f"{row['batch']:>12}"] + [
            fmt(row, k) for k in ("ours", "graph", "hf", "bound", "bound_kv", "graph_err")
        ]
        print(" | ".join(cells))
    print(
        "bound(wts) = batch / (weight bytes / copy bandwidth); bound(w+kv) adds the KV bytes read per step"
    )
    print(
        "triton eager/graph: the runner's step without sampling (host input prep included); "
        "graph err = max |graph - eager| logit (off CUDA the graph column runs uncaptured)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kernels-only", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny model on CPU, interpreter")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    import triton

    print(f"torch {torch.__version__}, triton {triton.__version__}, device "
          f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}", flush=True)  # fmt: skip
    if args.kernels_only:
        return 0 if check_kernels(device) else 1
    benchmark(args, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
