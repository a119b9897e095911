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
    # Unquantized: exact greedy parity with transformers in float32.
    runner = TorchModelRunner.from_loaded(loaded, quantization=None, block_size=16, num_blocks=64)
    got = greedy_driver_cls(runner).generate(prompts, MAX_NEW, chunk=16)
    assert got == want
    assert loaded.tokenizer.decode(got[0])  # real text, not an empty decode


def test_the_default_is_served_on_int4_where_it_is_fast_and_says_why(caplog):
    """The default model's layers are stored Q4_1, so the default (auto) serves them
    on int4 where the native kernels run (bfloat16 on AVX512-BF16, float32 on AVX2),
    unquantized
    elsewhere; the start-up log names the path and the stored type either way."""
    from sluiceway.config import EngineConfig, ModelConfig
    from sluiceway.model_engine import load_bundle
    from sluiceway.runner.quantization_choice import native_quantized_kernels

    with caplog.at_level("INFO", logger="sluiceway.model_engine"):
        bundle = load_bundle(ModelConfig(), EngineConfig(num_kv_blocks=8), progress=False)
    fast_here = native_quantized_kernels(bundle.loaded.dtype, "cpu")
    assert bundle.quantization == ("int4" if fast_here else None)
    assert "Q4_1" in caplog.text
    assert ("int4 weight-only" if fast_here else "unquantized") in caplog.text
    unquantized = load_bundle(
        ModelConfig(quantization="none"), EngineConfig(num_kv_blocks=8), progress=False
    )
    assert unquantized.quantization is None
