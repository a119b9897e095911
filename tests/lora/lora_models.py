"""Tiny random base models with random LoRA adapters made by `peft`, saved as PEFT
directories, and the greedy tokens `peft` + transformers' `generate` give for them."""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import peft
import torch
import trio

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


@contextlib.asynccontextmanager
async def serving_adapters(
    base: Any,
    tokenizer: Any,
    dirs: dict[str, str],
    *,
    max_loras: int,
    model_name: str,
    runtime_updates: bool = False,
) -> AsyncIterator[Any]:
    """A server on 127.0.0.1 (a free port) of `base` (a transformers model) with the
    PEFT adapters in `dirs` by name, served as `model_name`, loading and unloading
    adapters while serving with `runtime_updates`; stopped on the way out."""
    from sluiceway.api.serve import serve_async
    from sluiceway.config import EngineConfig, ServerConfig
    from sluiceway.engine.engine import Engine
    from sluiceway.engine.lora_modules import LoraModules
    from sluiceway.hub import HubOptions
    from sluiceway.model_engine import adapter_check
    from sluiceway.runner.model_runner import TorchModelRunner

    runner = TorchModelRunner(base.config, base.state_dict(), block_size=16, num_blocks=64)
    modules = LoraModules.of(dirs)
    table = runner.enable_lora(modules, max_loras=max_loras, max_rank=16)
    engine = Engine(
        runner,
        tokenizer,
        EngineConfig(),
        eos_token_ids=frozenset({tokenizer.eos_token_id}),
        max_model_len=256,
        lora_modules=modules,
        lora_check=adapter_check(table, HubOptions()) if runtime_updates else None,
    )
    async with trio.open_nursery() as nursery:
        yield await nursery.start(
            functools.partial(
                serve_async,
                engine,
                server_config=ServerConfig(host="127.0.0.1", port=0),
                model_name=model_name,
            )
        )
        nursery.cancel_scope.cancel()
