"""What constrained decoding costs a batch: output tokens/s of one engine batch with
every choice following a JSON Schema, against the same batch unconstrained, in
alternating rounds, and the grammar masks' fill and wait time per token.

Both sides generate exactly `--output-tokens` per choice (`ignore_eos`; the schema
asks for 50+ records, so no constrained output ends early). In-process (no HTTP),
so what is measured is the engine step: the masks filled beside the model and
applied in the sampler.

Run: `python benchmarks/structured_overhead.py --batches 1,8,32 --quantization int4`
"""

from __future__ import annotations

import argparse
import statistics
import time

from sluiceway.bench.serve_load import BENCH_SCHEMA
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.grammar import spec
from sluiceway.grammar.compiler import GrammarCompiler
from sluiceway.offline import LLM


def one_round(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> tuple[float, int]:
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    return seconds, sum(len(o.token_ids) for r in outputs for o in r.outputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quantization", default=None)
    args = parser.parse_args()
    llm = LLM(quantization=args.quantization, max_num_seqs=64)
    core = llm._core
    compiler = GrammarCompiler(llm.tokenizer, llm.bundle.loaded.eos_token_ids)
    grammar = compiler.compile(spec.json_schema(BENCH_SCHEMA))
    base = dict(max_tokens=args.output_tokens, temperature=0.0, ignore_eos=True)
    free = SamplingParams(**base)
    constrained = SamplingParams(**base, grammar=grammar)
    print("| batch | free tok/s | constrained tok/s | ratio | mask fill us/tok | mask wait us/tok |")
    print("|---:|---:|---:|---:|---:|---:|")
    for batch in (int(b) for b in args.batches.split(",")):
        prompts = [
            llm.encode_chat([{"role": "user", "content": f"List {i + 50} records as JSON."}])
            for i in range(batch)
        ]
        one_round(llm, prompts[:1], free)  # warm-up
        rates: dict[str, list[float]] = {"free": [], "constrained": []}
        before = core.stats()
        for r in range(args.rounds):
            order = [("free", free), ("constrained", constrained)]
            for name, params in order if r % 2 == 0 else order[::-1]:
                seconds, tokens = one_round(llm, prompts, params)
                rates[name].append(tokens / seconds)
        after = core.stats()
        rows = after.grammar_mask_rows_total - before.grammar_mask_rows_total
        fill = (after.grammar_mask_fill_seconds_total - before.grammar_mask_fill_seconds_total) / rows
        wait = (after.grammar_mask_wait_seconds_total - before.grammar_mask_wait_seconds_total) / rows
        f, c = statistics.median(rates["free"]), statistics.median(rates["constrained"])
        print(f"| {batch} | {f:.1f} | {c:.1f} | {c / f:.2f} | {fill * 1e6:.1f} | {wait * 1e6:.1f} |")


if __name__ == "__main__":
    main()
