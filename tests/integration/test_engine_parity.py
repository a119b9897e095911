"""Greedy output through the whole engine (scheduler, paged cache, runner) equals
Hugging Face transformers' `generate` on a tiny random Llama built in the test."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from sluiceway.engine.core import EngineCore
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.runner.model_runner import TorchModelRunner
from tiny_models import TINY_LLAMA  # tests/, on sys.path through tests/conftest.py

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
    core = EngineCore(
        runner,
        lambda ids: "",
        max_num_seqs=max_seqs,
        max_num_batched_tokens=budget,
        eos_token_ids=[],
        max_model_len=256,
        enable_prefix_caching=prefix,
    )
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0)
    results = []
    for round_ in range(rounds):
        tokens: dict[int, list[int]] = {}
        order = []
        cached = {}
        for i, prompt in enumerate(prompts):
            (seq_id,) = core.add_request(round_ * 100 + i, prompt, params)
            order.append(seq_id)
        while core.has_work():
            for seq_id, delta in core.step():
                tokens.setdefault(seq_id, []).extend(delta.token_ids)
                cached[seq_id] = delta.num_cached_prompt_tokens
        results.append(([tokens[s] for s in order], [cached[s] for s in order], core))
    return results


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
