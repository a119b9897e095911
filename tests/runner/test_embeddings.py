"""Embeddings through the engine core and the torch runner equal transformers'
last hidden state, mean- or last-pooled, for prompts chunked, batched with a
generation and preempted; and how a checkpoint's pooling is read."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig

from family_models import tiny
from greedy_rounds import bare_core, embed_all
from sluiceway.engine.pooling import PoolingSpec
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.runner.loading import pooling_spec
from sluiceway.runner.model_runner import TorchModelRunner

PROMPTS = [[5, 17, 99, 3, 42, 8, 250, 11, 64, 7, 1, 2, 3], [200, 201], [9] * 21, [4]]


def transformers_embedding(model, prompt, pooling):
    with torch.no_grad():
        hidden = model.model(torch.tensor([prompt])).last_hidden_state[0]
    return hidden.mean(0) if pooling == "mean" else hidden[-1]


@pytest.mark.parametrize("name", ["llama", "qwen3", "gemma2", "gemma3", "mistral-window"])
@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_embeddings_match_the_last_hidden_state(name, pooling):
    model = tiny(name)
    hidden_size = model.config.hidden_size
    # 12 blocks of 4 tokens cannot hold the grown generation and the prompts at
    # once, and 5 tokens a step chunk the long prompts.
    runner = TorchModelRunner(
        model.config,
        model.state_dict(),
        block_size=4,
        num_blocks=12,
        pooling=PoolingSpec(pooling, hidden_size),
    )
    core = bare_core(runner, budget=5, max_model_len=64)
    core.add_request(0, [7, 8, 9], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    for _ in range(30):  # the generation grows to nine blocks first
        core.step()
    got = embed_all(core, PROMPTS, pooling, first_request_id=1)
    assert core.stats().num_preemptions_total > 0
    for embedding, prompt in zip(got, PROMPTS, strict=True):
        want = transformers_embedding(model, prompt, pooling)
        torch.testing.assert_close(torch.tensor(embedding), want, rtol=1e-4, atol=1e-4)


def _config(**fields):
    return LlamaConfig(hidden_size=64, **fields)


def test_a_causal_lm_pools_its_last_token_at_its_own_width(tmp_path):
    assert pooling_spec(tmp_path, _config()) == PoolingSpec("last", 64, None)


def test_a_sentence_transformers_pooling_module_decides(tmp_path):
    (tmp_path / "modules.json").write_text(
        json.dumps(
            [
                {
                    "idx": 0,
                    "name": "0",
                    "path": "",
                    "type": "sentence_transformers.models.Transformer",
                },
                {
                    "idx": 1,
                    "name": "1",
                    "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling",
                },
            ]
        )
    )
    (tmp_path / "1_Pooling").mkdir()
    config = tmp_path / "1_Pooling" / "config.json"
    config.write_text(
        json.dumps({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False})
    )
    assert pooling_spec(tmp_path, _config()).pooling == "mean"
    config.write_text(json.dumps({"pooling_mode_lasttoken": True}))
    assert pooling_spec(tmp_path, _config()).pooling == "last"
    # Pooling this server does not compute: the model is served without embeddings.
    config.write_text(json.dumps({"pooling_mode_cls_token": True}))
    assert pooling_spec(tmp_path, _config()) is None
    config.write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    modules = json.loads((tmp_path / "modules.json").read_text())
    dense = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    (tmp_path / "modules.json").write_text(json.dumps([*modules, dense]))
    assert pooling_spec(tmp_path, _config()) is None


def test_a_runner_told_of_no_pooling_makes_no_embeddings():
    model = tiny("llama")
    runner = TorchModelRunner(
        model.config, model.state_dict(), block_size=4, num_blocks=8, pooling=False
    )
    assert runner.pooling is None
    core = bare_core(runner, budget=8, max_seqs=2, max_model_len=32)
    with pytest.raises(ValueError, match="does not produce embeddings"):
        core.add_request(0, [1, 2], SamplingParams(max_tokens=1), pooling="last")


def test_matryoshka_widths_come_from_the_config(tmp_path):
    listed = pooling_spec(tmp_path, _config(matryoshka_dimensions=[16, 32]))
    assert listed.matryoshka_dimensions == (16, 32)
    assert [listed.allows_dimensions(d) for d in (16, 24, 32, 64, 65)] == [
        True,
        False,
        True,
        True,
        False,
    ]
    anything = pooling_spec(tmp_path, _config(is_matryoshka=True))
    assert [anything.allows_dimensions(d) for d in (0, 1, 63, 64, 65)] == [
        False,
        True,
        True,
        True,
        False,
    ]
    fixed = pooling_spec(tmp_path, _config())
    assert [fixed.allows_dimensions(d) for d in (32, 64)] == [False, True]


PRECISION_PATHS = [
    pytest.param(dtype, quantization, id=f"{str(dtype).removeprefix('torch.')}-{quantization}")
    for dtype in (torch.float32, torch.bfloat16)
    for quantization in (None, "int8", "int4")
]


@pytest.mark.parametrize(("dtype", "quantization"), PRECISION_PATHS)
@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_an_embedding_is_the_same_bits_alone_in_a_batch_and_beside_generation(
    dtype, quantization, pooling
):
    # Every path runs on any x86 host: bfloat16 without AVX512-BF16 runs torch's
    # portable kernels. In a shared batch the quantized layers switch from their
    # quantized kernel to the dense product past a few rows, and half precision
    # rounds the two differently; a short text alone stays under that count.
    model = tiny("llama")
    runner = TorchModelRunner(
        model.config,
        model.state_dict(),
        dtype=dtype,
        quantization=quantization,
        block_size=4,
        num_blocks=64,
        pooling=PoolingSpec(pooling, model.config.hidden_size),
    )
    core = bare_core(runner, budget=32, max_seqs=4, max_model_len=128)
    assert core.scheduler.embedding_chunk_tokens == 29
    short = [5, 17, 99, 3, 42, 8]
    long = [(7 * i + 3) % 250 + 3 for i in range(40)]  # two chunks: 29 and 11
    others = [[9] * 21, [200, 201, 7, 7], [11] * 13]
    alone = embed_all(core, [short], pooling) + embed_all(core, [long], pooling, 1)
    in_a_batch = embed_all(core, [others[0], short, *others[1:], long], pooling, 10)
    core.add_request(
        100, [7, 8, 9], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    )
    core.step()  # the generation decodes while the embeddings run
    beside_generation = embed_all(core, [long, short], pooling, 101)
    assert in_a_batch[1] == alone[0] and in_a_batch[-1] == alone[1]
    assert beside_generation == [alone[1], alone[0]]
    if quantization is None:  # and still the model's vector, to half precision's rounding
        want = transformers_embedding(model, short, pooling)
        tol = 1e-4 if dtype == torch.float32 else 5e-2
        torch.testing.assert_close(torch.tensor(alone[0]), want, rtol=tol, atol=tol)
