"""How much weight-only quantization changes the default model: perplexity and
greedy agreement against float32 on a fixed English text.

    .venv/bin/python benchmarks/quantization_quality.py [--variants bfloat16,int8,int4]

Every variant scores the same tokens with teacher forcing (one runner forward
over the whole text, logits for every position). Reports perplexity, the mean
KL divergence from float32's next-token distribution, and how often the variant's
argmax equals float32's. Variants `int8` and `int4` are bfloat16 with that
quantization, `float32+int8` and `float32+int4` float32 with it (the path a CPU
without bfloat16 serves); the text is scored 8 tokens at a time for the quantized
variants, so the quantized kernels serve every step, as they serve the server's
decode steps at a few streams.
"""

from __future__ import annotations

import argparse

import torch

from sluiceway.engine.batch import ScheduledChunk
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.runner.loading import load_model
from sluiceway.runner.model_runner import TorchModelRunner, build_inputs

TEXT = (
    "The river rose through the night, and by morning the low fields east of the town "
    "were under water. Farmers who had lived there for forty years said they had never "
    "seen the current so strong. The mayor opened the school as a shelter, and volunteers "
    "carried blankets, bread and lamps across the old stone bridge before it was closed. "
    "Engineers from the county measured the water every hour. They explained that the "
    "sluice gates upstream had been opened to protect the dam, which sent more water down "
    "the valley than the channels could hold. By the third day the rain stopped, the "
    "river fell, and people began to return to their houses to count what had been lost "
    "and what could still be saved. Children found fish stranded in the orchards, and the "
    "baker, whose oven had stayed dry on its brick platform, gave away every loaf he made."
)


def score(runner: TorchModelRunner, ids: list[int], rows_per_step: int) -> torch.Tensor:
    """float32 log-probabilities of every next token: `[len(ids) - 1, vocab]`."""
    params = SamplingParams(temperature=0.0)
    table = list(range(1, 1 + -(-len(ids) // runner.block_size)))
    out = []
    with torch.inference_mode():
        for start in range(0, len(ids) - 1, rows_per_step):
            chunk = ScheduledChunk(
                seq_id=0,
                token_ids=ids[start : min(start + rows_per_step, len(ids) - 1)],
                start_pos=start,
                block_table=table,
                sample=True,
                params=params,
            )
            inputs = build_inputs((chunk,), runner.block_size, runner.model.shape.scale, "cpu")
            meta = runner.attention.prepare(inputs.meta)
            every_row = torch.arange(len(chunk.token_ids))
            logits = runner.model.forward(
                inputs.input_ids, inputs.positions, runner.attention, meta, every_row
            )
            out.append(torch.log_softmax(logits, dim=-1))
    return torch.cat(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--variants", default="bfloat16,int8,int4")
    args = p.parse_args()
    reference = load_model(None, "float32", progress=False)
    ids = reference.tokenizer(TEXT)["input_ids"]
    targets = torch.tensor(ids[1:])

    def runner_for(loaded, quantization=None) -> TorchModelRunner:
        return TorchModelRunner.from_loaded(
            loaded, num_blocks=-(-len(ids) // 16) + 2, quantization=quantization
        )

    want = score(runner_for(reference), ids, len(ids))
    rows = [("float32", want)]
    models = {"float32": reference}
    for variant in args.variants.split(","):
        dtype, _, quantization = variant.rpartition("+")
        if variant == "bfloat16":
            dtype, quantization = "bfloat16", ""
        dtype = dtype or "bfloat16"
        if dtype not in models:
            models[dtype] = load_model(None, dtype, progress=False)
        step_rows = 8 if quantization else len(ids)
        runner = runner_for(models[dtype], quantization or None)
        rows.append((variant, score(runner, ids, step_rows)))
    print(f"{len(targets)} scored tokens of a fixed English text, default model")
    print("| variant | perplexity | KL from float32 (nats/token) | argmax = float32 |")
    print("|---|---:|---:|---:|")
    for name, logp in rows:
        nll = -logp.gather(1, targets[:, None]).mean()
        kl = (want.exp() * (want - logp)).sum(-1).mean()
        agree = (logp.argmax(-1) == want.argmax(-1)).float().mean()
        print(f"| {name} | {nll.exp():.2f} | {kl:.4f} | {100 * agree:.1f}% |")


if __name__ == "__main__":
    main()
