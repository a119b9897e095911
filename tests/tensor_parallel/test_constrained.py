"""Constrained choices over ranks: the API process fills a step's token masks while
the ranks run the forward pass and sends them to rank 0 for sampling; outputs
match one device token for token and follow their grammars."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from tp_helpers import start_ranks, tiny_llama

from sluiceway.engine.core import EngineCore
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.grammar import spec
from sluiceway.grammar.compiler import GrammarCompiler
from sluiceway.runner.model_runner import TorchModelRunner
from sluiceway.runner.tensor_parallel import TensorParallelRunner


@pytest.fixture(scope="module")
def model(tokenizer: Any) -> torch.nn.Module:
    return tiny_llama(kv_heads=2, vocab=len(tokenizer))


@pytest.fixture(scope="module")
def ranks(model: torch.nn.Module) -> Iterator[TensorParallelRunner]:
    runner = start_ranks(model, 2, block_size=16, num_blocks=64)
    try:
        yield runner
    finally:
        runner.close()


def run(runner: Any, tokenizer: Any, compiler: GrammarCompiler) -> list[tuple[list[int], str]]:
    core = EngineCore(
        runner,
        lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True),
        max_num_seqs=8,
        max_num_batched_tokens=256,
        eos_token_ids=[tokenizer.eos_token_id],
        max_model_len=1024,
    )
    constraints = [spec.choice(["yes", "no", "maybe"]), spec.regex(r"[0-9]{3}-[a-z]{2}"), None]
    order = []
    for i, constraint in enumerate(constraints):
        grammar = None if constraint is None else compiler.compile(constraint)
        params = SamplingParams(max_tokens=12, temperature=0.0, grammar=grammar)
        order.append(core.add_request(i, tokenizer.encode("Answer:"), params)[0])
    tokens: dict[int, list[int]] = {}
    texts: dict[int, str] = {}
    while core.has_work():
        for seq_id, delta in core.step():
            tokens.setdefault(seq_id, []).extend(delta.token_ids)
            texts[seq_id] = texts.get(seq_id, "") + delta.text
    return [(tokens[s], texts[s]) for s in order]


def test_constrained_choices_match_one_device(model, ranks, tokenizer) -> None:
    compiler = GrammarCompiler(tokenizer, [tokenizer.eos_token_id])
    one = TorchModelRunner(model.config, model.state_dict(), block_size=16, num_blocks=64)
    want = run(one, tokenizer, compiler)
    got = run(ranks, tokenizer, compiler)
    assert got == want
    (_, choice), (_, code), _ = got
    assert choice in ("yes", "no", "maybe")
    assert len(code) == 6 and code[3] == "-", code
