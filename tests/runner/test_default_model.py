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
    from sluiceway.runner.checkpoint.reference import transformers_module

    module = transformers_module(loaded.hf_config, loaded.state_dict(), torch_dtype=torch.float32)
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


EMBEDDED_TEXTS = ["Paris is the capital of France.", "Rain is expected tomorrow.", "hi"]


@pytest.fixture(scope="module")
def loaded_bf16():
    return load_model(None, dtype="bfloat16", progress=False)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("quantization", [None, "int4"])
def test_every_precision_path_embeds_a_text_to_the_same_bits_however_it_is_batched(
    dtype, quantization, request
):
    """Each path the default model can be served on runs here on any x86 host (a
    host without AVX512-BF16 runs bfloat16 on torch's portable kernels), so a
    defect of one path shows on a CI host that would not pick it by itself."""
    from greedy_rounds import bare_core, embed_all
    from sluiceway.engine.sampling_params import SamplingParams

    loaded = request.getfixturevalue("loaded" if dtype == "float32" else "loaded_bf16")
    assert loaded.dtype is getattr(torch, dtype)
    runner = TorchModelRunner.from_loaded(loaded, quantization=quantization, num_blocks=64)
    core = bare_core(runner, budget=256, max_seqs=8)
    tokenizer = loaded.tokenizer
    ids = [tokenizer.encode(t) for t in EMBEDDED_TEXTS]
    alone = [embed_all(core, [i], "last", n)[0] for n, i in enumerate(ids)]
    together = embed_all(core, ids, "last", 10)
    chat = tokenizer.apply_chat_template(
        CHATS[0], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    core.add_request(20, chat, SamplingParams(temperature=0.0, max_tokens=MAX_NEW))
    core.step()  # a generation decodes beside the embeddings
    beside = embed_all(core, ids[::-1], "last", 21)[::-1]
    assert together == alone and beside == alone
    # Every path computes the same model: close to float32's unquantized vector.
    reference = request.getfixturevalue("float32_vectors")
    for vector, want in zip(alone, reference, strict=True):
        cosine = torch.nn.functional.cosine_similarity(
            torch.tensor(vector), torch.tensor(want), dim=0
        )
        assert cosine > 0.95, cosine


@pytest.fixture(scope="module")
def float32_vectors(loaded):
    from greedy_rounds import bare_core, embed_all

    runner = TorchModelRunner.from_loaded(loaded, quantization=None, num_blocks=64)
    ids = [loaded.tokenizer.encode(t) for t in EMBEDDED_TEXTS]
    return embed_all(bare_core(runner, budget=256), ids, "last")
