"""End to end on the real default model (SmolLM2-135M-Instruct GGUF)."""

from __future__ import annotations

import pytest
import torch

from sluiceway.runner.loading import load_model
from sluiceway.runner.model_runner import TorchModelRunner

pytestmark = pytest.mark.slow

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Write a haiku about rivers and locks."},
    ],
]
MAX_NEW = 12


@pytest.fixture(scope="module")
def loaded():
    return load_model(None, dtype="float32", progress=False)


def test_default_model_metadata(loaded):
    assert loaded.name == "SmolLM2-135M-Instruct"
    assert loaded.hf_config.model_type == "llama"
    assert loaded.dtype is torch.float32
    assert loaded.tokenizer.eos_token_id in loaded.eos_token_ids
    assert loaded.max_model_len == 8192
    assert loaded.tokenizer.chat_template


def test_default_model_greedy_matches_generate(loaded, greedy_driver_cls, hf_greedy_fn):
    prompts = [
        loaded.tokenizer.apply_chat_template(
            chat, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for chat in CHATS
    ]
    module = loaded.module
    module.generation_config.eos_token_id = None
    want = [hf_greedy_fn(module, p, MAX_NEW) for p in prompts]
    runner = TorchModelRunner.from_loaded(loaded, block_size=16, num_blocks=64)
    got = greedy_driver_cls(runner).generate(prompts, MAX_NEW, chunk=16)
    assert got == want
    assert loaded.tokenizer.decode(got[0])  # real text, not an empty decode
