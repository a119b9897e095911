"""Tiny random base models with random LoRA adapters made by `peft`, saved as PEFT
directories, and the greedy tokens `peft` + transformers' `generate` give for them."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import peft
import torch

from family_models import tiny

# Every linear LoRA is served on; Phi-3 names its fused ones itself.
TARGETS = {
    "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
}
# The model name and prompt of the server tests (`conftest.models`).
BASE = "tiny-base"
PROMPT = [1, 504, 2130, 314, 253, 3811, 28]
MAX_NEW = 8

DEFAULT_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def peft_model(family: str, seed: int, rank: int = 4, alpha: float = 8.0, **extra) -> peft.PeftModel:
    """`tiny(family)` (a copy) with one LoRA adapter of `rank` on every linear, its
    A and B drawn afresh from `seed` (B non-zero, so the adapter changes outputs)."""
    base = copy.deepcopy(tiny(family))
    config = peft.LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=TARGETS.get(family, DEFAULT_TARGETS),
        lora_dropout=0.0,
        init_lora_weights=False,
        **extra,
    )
    model = peft.get_peft_model(base, config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.15)
    return model


def save_adapter(model: peft.PeftModel, directory: Path) -> Path:
    model.save_pretrained(str(directory))
    return directory


def peft_greedy(model, prompt: list[int], max_new: int) -> tuple[int, ...]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        gen = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new,
            min_new_tokens=max_new,
            pad_token_id=0,
        )
    return tuple(gen[0, len(prompt) :].tolist())


@functools.cache
def base_greedy(family: str, prompt: tuple[int, ...], max_new: int) -> tuple[int, ...]:
    return peft_greedy(tiny(family), list(prompt), max_new)
