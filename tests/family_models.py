"""Tiny random models of every registered family, built from their transformers
configs in-process (no hub): shared by the runner's and the tensor-parallel
parity tests."""

from __future__ import annotations

import functools
from typing import Any

import torch
import transformers

from tiny_models import TINY_LLAMA

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
    # Dynamic NTK changes nothing within the original context, which these
    # prompts stay inside (as the runner's context is, see `models/rope.py`).
    "llama-dynamic-rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0)),
    ),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None)),
    # Windows of 8 tokens: every prompt plus its 32 new tokens outgrows them.
    "mistral-window": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=8)),
    "qwen3-window": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(head_dim=16, use_sliding_window=True, sliding_window=8, max_window_layers=1),
    ),
    # Soft caps low enough to bite; queries scaled by 1/sqrt(256), not 1/sqrt(16).
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(head_dim=16, sliding_window=8, attn_logit_softcapping=5.0, final_logit_softcapping=3.0),
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(head_dim=16, sliding_window=8, layer_types=["sliding_attention", "full_attention"]),
    ),
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
