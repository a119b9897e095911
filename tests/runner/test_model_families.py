"""Every registered family, greedy-exact to transformers: a tiny random model of
each is built from its transformers config in-process, and its greedy tokens
through the runner equal `generate`'s over 32 tokens, for prompts alone, batched
with each other through chunked prefill, and across preemption and prefix-cache
hits on an engine core."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import transformers

from greedy_rounds import FewerBlocks, greedy_rounds
from sluiceway.runner.model_runner import TorchModelRunner
from sluiceway.runner.models.architecture import UnsupportedModel
from sluiceway.runner.models.registry import SUPPORTED_MODEL_TYPES, check_supported, family_for
from tiny_models import TINY_LLAMA

MAX_NEW = 32
PROMPTS = [[5, 17, 99, 3, 42, 8, 250, 11, 64, 7, 1, 2, 3], [200, 201], [9] * 21, [4, 8, 15, 16, 23, 42]]
BASE = dict(TINY_LLAMA, vocab_size=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
MOE = dict(num_experts_per_tok=2)

# name -> (config class, model class, config fields beyond BASE)
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(attention_bias=True, mlp_bias=True)),
    "llama3-rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            tie_word_embeddings=True,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=16,
            ),
        ),
    ),
    "llama-linear-rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0)),
    ),
    "llama-yarn-rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            rope_parameters=dict(
                rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=128
            )
        ),
    ),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5))),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(no_rope_layers=[1, 0], tie_word_embeddings=True)),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(MOE, head_dim=16, num_experts=4, moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[1]),
    ),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(MOE, num_local_experts=4)),
}


@functools.cache
def tiny(name: str) -> torch.nn.Module:
    """A tiny random model of family `name`: every weight drawn afresh (biases and
    norm scales included, so a weight read from the wrong place shows), sharper
    than the init so that greedy ties cannot decide."""
    config_cls, model_cls, extra = FAMILIES[name]
    config = getattr(transformers, config_cls)(**BASE, **extra)
    torch.manual_seed(sorted(FAMILIES).index(name))
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for param_name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in param_name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            else:
                p.normal_(0, 0.3)
    model.generation_config.eos_token_id = None
    return model


@functools.cache
def expected(name: str) -> tuple[tuple[int, ...], ...]:
    model = tiny(name)
    out = []
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            gen = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=MAX_NEW,
                min_new_tokens=MAX_NEW,
                pad_token_id=0,
            )
        out.append(tuple(gen[0, len(prompt) :].tolist()))
    return tuple(out)


def runner(name: str, num_blocks: int = 96) -> TorchModelRunner:
    model = tiny(name)
    return TorchModelRunner(model.config, model.state_dict(), block_size=4, num_blocks=num_blocks)


def test_every_family_here_is_registered():
    assert {tiny(n).config.model_type for n in FAMILIES} == SUPPORTED_MODEL_TYPES


@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_prompt_alone_matches_generate(name):
    want = expected(name)
    for prompt, tokens in zip(PROMPTS, want, strict=True):
        [run] = greedy_rounds(runner(name), [prompt], max_new=MAX_NEW, budget=512)
        assert tuple(run.tokens[0]) == tokens


@pytest.mark.parametrize("name", list(FAMILIES))
def test_batched_chunked_preempted_and_cached_match_generate(name):
    # 5 tokens a step: the 13- and 21-token prompts are prefilled in chunks; 24
    # blocks of 4 tokens cannot hold every sequence at once; round two hits the
    # prefix cache.
    runs = greedy_rounds(FewerBlocks(runner(name), 24), PROMPTS, max_new=MAX_NEW, budget=5, rounds=2)
    assert runs[0].preemptions > 0 and runs[1].cached[2] > 0
    for run in runs:
        assert tuple(map(tuple, run.tokens)) == expected(name)


def test_a_model_type_no_family_serves_is_named():
    config = transformers.GPT2Config()
    with pytest.raises(UnsupportedModel, match="unsupported architecture 'gpt2' \\(config field model_type\\)"):
        family_for(config)


def test_an_unsupported_activation_is_named():
    config = transformers.LlamaConfig(**dict(BASE, hidden_act="relu"))
    with pytest.raises(UnsupportedModel, match="hidden_act 'relu'"):
        check_supported(config)
