"""Microbenchmark of what a reasoning parser adds to each streamed token: the
splitter's `feed` of one token's text while the model thinks, and the check that
lets an answer's tokens take the ordinary streaming path once the thinking is
over.

    PYTHONPATH=src .venv/bin/python benchmarks/reasoning_split.py [--rounds 7] [--number 20000]

Prints the median µs per call.
"""

from __future__ import annotations

import argparse
import statistics
import timeit

from sluiceway.reasoning import FORMATS, ReasoningSplitter

WORDS = [" the", " river", " flows", " under", " a", " quiet", " bridge", " <", "/", "th"]


def _per_call(fn: object, rounds: int, number: int) -> float:
    times = timeit.repeat(fn, number=number, repeat=rounds)  # type: ignore[arg-type]
    return statistics.median(times) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--number", type=int, default=20000)
    args = parser.parse_args()
    fmt = FORMATS["qwen3"]

    thinking = ReasoningSplitter.for_prompt(fmt, "open")
    cycle = iter(range(1 << 62))

    def think() -> None:
        thinking.feed(WORDS[next(cycle) % len(WORDS)])

    answering = ReasoningSplitter.for_prompt(fmt, "closed")

    def answer() -> None:
        if not answering.passes_through:
            answering.feed(" the")

    rows = [
        ("feed, thinking (held-back tag prefixes included)", think),
        ("answer, passing through (the streaming fast path)", answer),
    ]
    for name, fn in rows:
        print(f"{name:55s} {_per_call(fn, args.rounds, args.number):8.3f} µs")


if __name__ == "__main__":
    main()
