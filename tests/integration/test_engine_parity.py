"""Greedy output through the whole engine (scheduler, paged cache, runner) equals
Hugging Face transformers' `generate` on a tiny random Llama built in the test."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from greedy_rounds import greedy_rounds
from sluiceway.runner.model_runner import TorchModelRunner
from tiny_models import TINY_LLAMA

PROMPTS = [
    [5, 17, 99, 3, 42, 8, 250, 11, 64, 7, 1, 2, 3],
    [200, 201],
    [9] * 21,
    [4, 8, 15, 16, 23, 42, 4, 8],
]
MAX_NEW = 12


@pytest.fixture(scope="module")
def hf_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        **dict(TINY_LLAMA, max_position_embeddings=256),
        vocab_size=256,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)  # sharper logits than the init, so greedy ties cannot decide
    return model


@pytest.fixture(scope="module")
def expected(hf_model) -> list[list[int]]:
    outs = []
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = hf_model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=MAX_NEW,
                min_new_tokens=MAX_NEW,
                do_sample=False,
                pad_token_id=0,
            )
        outs.append(out[0, len(prompt):].tolist())
    return outs


def run_engine(hf_model, prompts, *, num_blocks=64, block_size=4, budget=512, max_seqs=8, prefix=True, rounds=1):
    # Unquantized float32 on purpose: this checks exact parity with transformers.
    runner = TorchModelRunner(
        hf_model.config,
        hf_model.state_dict(),
        dtype=torch.float32,
        quantization=None,
        block_size=block_size,
        num_blocks=num_blocks,
    )
    runs = greedy_rounds(
        runner, prompts, max_new=MAX_NEW, budget=budget, max_seqs=max_seqs, prefix=prefix,
        rounds=rounds,
    )  # fmt: skip
    return [(run.tokens, run.cached, run.core) for run in runs]


def test_each_prompt_alone_matches_transformers(hf_model, expected):
    for prompt, want in zip(PROMPTS, expected, strict=True):
        [(got, _, _)] = run_engine(hf_model, [prompt])
        assert got == [want]


def test_batched_together_matches_transformers(hf_model, expected):
    [(got, _, _)] = run_engine(hf_model, PROMPTS)
    assert got == expected


def test_chunked_prefill_matches_transformers(hf_model, expected):
    # Prompts of 13 and 21 tokens cannot fit a 5-token step: they are prefilled in chunks.
    [(got, _, _)] = run_engine(hf_model, PROMPTS, budget=5)
    assert got == expected


def test_forced_preemption_matches_transformers(hf_model, expected):
    [(got, _, core)] = run_engine(hf_model, PROMPTS, num_blocks=12, block_size=4, prefix=False)
    assert core.scheduler.num_preemptions > 0
    assert got == expected


def test_prefix_cache_hit_gives_the_same_tokens_as_a_miss(hf_model, expected):
    first, second = run_engine(hf_model, PROMPTS, rounds=2)
    assert first[0] == second[0] == expected
    assert first[1] == [0, 0, 0, 0]
    assert second[1][0] == 12 and second[1][2] == 20  # whole blocks of the repeated prompts
