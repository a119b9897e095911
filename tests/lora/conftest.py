"""The served tiny model and its two peft adapters, shared by the server tests."""

from __future__ import annotations

import copy
from typing import Any

import peft
import pytest
import torch
from hub_fixtures import hf_home, hub

from tiny_models import TINY_LLAMA

__all__ = ["hf_home", "hub"]  # adapters fetched by hub id


@pytest.fixture(scope="package")
def models(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny random Llama over the SmolLM2 vocabulary and two peft adapters on it,
    saved as PEFT directories: {"base": model, "a": peft model, "b": ..., "dirs"}."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**TINY_LLAMA, vocab_size=len(tokenizer), bos_token_id=1, eos_token_id=2)
    base = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in base.parameters():
            if p.dim() > 1:  # norm scales stay at one
                p.normal_(0, 0.3)
    base.generation_config.eos_token_id = None
    out: dict[str, Any] = {"base": base, "dirs": {}}
    for seed, name in enumerate(("a", "b"), start=1):
        lora = peft.LoraConfig(
            r=4,
            lora_alpha=8,
            target_modules=["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"],
            init_lora_weights=False,
        )
        model = peft.get_peft_model(copy.deepcopy(base), lora).eval()
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param_name, p in model.named_parameters():
                if "lora_" in param_name:
                    p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
        path = tmp_path_factory.mktemp("adapters") / name
        model.save_pretrained(str(path))
        out[name], out["dirs"][name] = model, str(path)
    return out


@pytest.fixture
def triton_interpreted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton kernels launched on CPU tensors run in triton's interpreter, as
    tests/kernels runs them (without CUDA)."""
    pytest.importorskip("triton")
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
