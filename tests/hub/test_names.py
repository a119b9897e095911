"""What the user typed, and which files of a repository serving takes: pure
functions of names, no hub."""

from __future__ import annotations

import logging

import pytest

from sluiceway.hub import HubError
from sluiceway.hub.files import directory_plan, gguf_plan, is_gguf_repo, quant_of
from sluiceway.hub.model_id import HubModelId, parse_model_id


def test_hub_ids_and_local_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_model_id("Qwen/Qwen3-0.6B") == HubModelId("Qwen/Qwen3-0.6B", None, "Qwen/Qwen3-0.6B")
    assert parse_model_id("unsloth/Qwen3-8B-GGUF:q4_k_m") == HubModelId(
        "unsloth/Qwen3-8B-GGUF", "q4_k_m", "unsloth/Qwen3-8B-GGUF:q4_k_m"
    )
    assert parse_model_id("bartowski/Llama-3.2-1B-Instruct-GGUF:UD-Q4_K_XL").quant == "UD-Q4_K_XL"
    for path in (
        "/models/llama",
        "./llama",
        "~/llama",
        "../org/name",
        "model.gguf",
        "org/model.Q4_0.gguf",
        "a/b/c",
        "single-name",
        "org/bad--name",
        "org/-dash",
        "org/name:",
    ):
        assert parse_model_id(path) is None, path
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert parse_model_id("org/name") is None  # the directory wins
    assert parse_model_id("org/other") is not None


CONFIG_AND_TOKENIZER = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "merges.txt",
    "vocab.json",
    "chat_template.jinja",
]


def test_a_model_directory_takes_its_config_tokenizer_and_safetensors():
    names = [
        *CONFIG_AND_TOKENIZER,
        "model.safetensors",
        "pytorch_model.bin",
        "tf_model.h5",
        "onnx/model.onnx",
        "onnx/config.json",
        "README.md",
        ".gitattributes",
        "LICENSE.txt",
    ]
    plan = directory_plan("org/m", names)
    assert plan.index is None
    assert sorted(plan.files) == sorted([*CONFIG_AND_TOKENIZER, "model.safetensors"])


def test_a_sharded_model_fetches_its_index_first_and_no_other_copy():
    names = [
        "config.json",
        "model.safetensors.index.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "consolidated.safetensors",
        "pytorch_model.bin.index.json",
        "pytorch_model-00001-of-00002.bin",
    ]
    plan = directory_plan("org/m", names)
    assert plan.index == "model.safetensors.index.json"
    assert plan.files == ("config.json", "model.safetensors.index.json")


def test_a_repository_without_served_weights_names_what_it_holds():
    with pytest.raises(HubError, match=r"^org/m has no config\.json, so it is not a Hugging Face model "
                       r"\(it holds: PyTorch \.bin\)$"):
        directory_plan("org/m", ["pytorch_model.bin", "README.md"])
    with pytest.raises(HubError, match=r"it holds: Flax \.msgpack, TensorFlow \.h5$"):
        directory_plan("org/m", ["config.json", "tf_model.h5", "flax_model.msgpack"])


GGUFS = [
    "Tiny-Q4_K_M.gguf",
    "Tiny-Q8_0.gguf",
    "Tiny-IQ4_XS.gguf",
    "Tiny-UD-Q4_K_XL.gguf",
    "BF16/Tiny-BF16-00001-of-00002.gguf",
    "BF16/Tiny-BF16-00002-of-00002.gguf",
    "mmproj-Tiny-F16.gguf",
    "README.md",
]


def test_a_gguf_file_names_its_quant():
    assert quant_of("Qwen3-8B-Q4_K_M.gguf") == "Q4_K_M"
    assert quant_of("qwen2.5-7b-instruct-q5_k_m-00001-of-00002.gguf") == "Q5_K_M"
    assert quant_of("SmolLM2-135M-Instruct.Q4_1.gguf") == "Q4_1"
    assert quant_of("ggml-model-f16.gguf") == "F16"
    assert quant_of("Llama-UD-Q4_K_XL.gguf") == "UD-Q4_K_XL"
    assert quant_of("weights.gguf") == "WEIGHTS"


def test_a_quant_is_picked_by_name_case_insensitively():
    assert gguf_plan("o/T", GGUFS, "q8_0").files == ("Tiny-Q8_0.gguf",)
    assert gguf_plan("o/T", GGUFS, "iq4_xs").files == ("Tiny-IQ4_XS.gguf",)
    assert gguf_plan("o/T", GGUFS, "Q4_K_XL").files == ("Tiny-UD-Q4_K_XL.gguf",)
    assert gguf_plan("o/T", ["m-Q4_K_M-imat.gguf", "m-Q8_0-imat.gguf"], "q8_0").files == ("m-Q8_0-imat.gguf",)
    with pytest.raises(HubError, match=r"^o/T has no Q4_K GGUF; quants there: Q4_K_M$"):
        gguf_plan("o/T", ["m-Q4_K_M.gguf"], "Q4_K")  # a family of quants, not one
    split = gguf_plan("o/T", GGUFS, "bf16")
    assert split.quant == "BF16"
    assert split.files == ("BF16/Tiny-BF16-00001-of-00002.gguf", "BF16/Tiny-BF16-00002-of-00002.gguf")


def test_without_a_quant_the_only_one_or_q4_k_m_is_taken_and_said(caplog):
    with caplog.at_level(logging.INFO):
        assert gguf_plan("o/T", GGUFS, None).files == ("Tiny-Q4_K_M.gguf",)
    assert "o/T holds 5 quants (BF16, IQ4_XS, Q4_K_M, Q8_0, UD-Q4_K_XL): serving Q4_K_M" in caplog.text
    assert gguf_plan("o/T", ["a-Q8_0.gguf", "a-Q4_0.gguf"], None).files == ("a-Q4_0.gguf",)
    assert gguf_plan("o/T", ["a-Q6_K.gguf", "a-Q5_K_S.gguf"], None).files == ("a-Q5_K_S.gguf",)
    assert gguf_plan("o/T", ["only-Q6_K.gguf", "mmproj-F16.gguf"], None).files == ("only-Q6_K.gguf",)


def test_a_missing_quant_lists_those_there_and_a_split_needs_every_part():
    with pytest.raises(HubError, match=r"^o/T has no Q5_K_M GGUF; quants there: "
                       r"BF16, IQ4_XS, Q4_K_M, Q8_0, UD-Q4_K_XL$"):
        gguf_plan("o/T", GGUFS, "Q5_K_M")
    with pytest.raises(HubError, match=r"lacks parts: BF16/Tiny-BF16-00002-of-00002\.gguf$"):
        gguf_plan("o/T", GGUFS[:5], "BF16")
    with pytest.raises(HubError, match=r"^o/T has no GGUF files; it holds: PyTorch \.bin$"):
        gguf_plan("o/T", ["config.json", "pytorch_model.bin"], "Q4_0")


def test_a_repository_is_gguf_when_it_holds_no_hugging_face_model():
    assert is_gguf_repo(GGUFS)
    assert is_gguf_repo(["config.json", "model-Q4_0.gguf"])
    assert not is_gguf_repo(["config.json", "model.safetensors", "model-Q4_0.gguf"])
    assert not is_gguf_repo(["config.json", "model.safetensors"])
