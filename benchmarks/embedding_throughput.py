"""What embeddings cost through the engine: inputs a second and input tokens a
second for one request of many inputs, on the default model, in the engine core
(no HTTP).

    .venv/bin/python benchmarks/embedding_throughput.py [--inputs 64] [--rounds 3] \
        [--dtype auto] [--quantization auto]

Each round embeds `inputs` texts of mixed lengths (about 8 to 120 tokens) in one
request, then the same texts again beside a greedy generation that decodes
meanwhile. Prints the median over the rounds. It uses only the engine core's
public calls, so the same script measures any commit (the cost of running each
embedding chunk as a batch of its own is this script at two commits).
Run nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import statistics
import time

from sluiceway.config import EngineConfig, ModelConfig
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.model_engine import build_core, load_bundle

WORDS = "the river flows under a quiet bridge and on past the old mill toward the sea".split()


def texts(count: int) -> list[str]:
    """`count` texts of 4 to 60 words, deterministic."""
    return [
        " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(4 + (i * 13) % 57))
        for i in range(count)
    ]


def embed_round(core, prompts: list[list[int]], first_id: int, beside: list[int] | None) -> float:
    """Seconds to embed every prompt (in one group, as one request's inputs)."""
    if beside is not None:
        params = SamplingParams(temperature=0.0, max_tokens=10_000, ignore_eos=True)
        core.add_request(first_id - 1, beside, params)
    start = time.perf_counter()
    pending = set()
    for i, prompt in enumerate(prompts):
        (seq_id,) = core.add_request(
            first_id + i, prompt, SamplingParams(max_tokens=1), group="inputs", pooling="last"
        )
        pending.add(seq_id)
    while pending:
        for seq_id, delta in core.step():
            if delta.embedding is not None:
                pending.discard(seq_id)
    elapsed = time.perf_counter() - start
    if beside is not None:
        core.abort_request(first_id - 1)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--quantization", default="auto")
    args = parser.parse_args()
    config = EngineConfig()
    bundle = load_bundle(
        ModelConfig(dtype=args.dtype, quantization=args.quantization), config, progress=False
    )
    core = build_core(bundle, config)
    tokenizer = bundle.loaded.tokenizer
    prompts = [tokenizer.encode(t) for t in texts(args.inputs)]
    tokens = sum(map(len, prompts))
    generation = tokenizer.encode("Tell me a long story about a river.")
    print(
        f"{bundle.name} {bundle.loaded.dtype} quantization={bundle.quantization}: "
        f"{args.inputs} inputs, {tokens} tokens, {config.max_num_batched_tokens} tokens a step"
    )
    embed_round(core, prompts[:4], 1_000_000, None)  # warm-up
    for label, beside in (("alone", None), ("beside a decode", generation)):
        seconds = []
        for r in range(args.rounds):
            first_id = (r + 1) * 10_000 + (5_000 if beside else 0)
            seconds.append(embed_round(core, prompts, first_id, beside))
        median = statistics.median(seconds)
        print(
            f"{label:>16}: {args.inputs / median:8.1f} inputs/s {tokens / median:9.1f} tok/s "
            f"(median of {args.rounds}: {median:.3f} s; rounds "
            + ", ".join(f"{s:.3f}" for s in seconds)
            + ")"
        )


if __name__ == "__main__":
    main()
