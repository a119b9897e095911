"""Model loading: the default GGUF, Hugging Face directories, and clear errors."""

from __future__ import annotations

import json
import os

import pytest
import torch

from sluiceway.runner.loading import ModelLoadError, load_model, resolve_dtype


def test_missing_path_is_a_model_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(str(tmp_path / "nope"))
    with pytest.raises(ModelLoadError, match="GGUF file not found"):
        load_model(str(tmp_path / "nope.gguf"))


def test_directory_without_config_is_a_model_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        load_model(str(tmp_path))


def test_unsupported_architecture_is_a_model_load_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ModelLoadError, match="unsupported architecture 'gpt2'"):
        load_model(str(tmp_path), progress=False)


def test_unreadable_weights_are_a_model_load_error(tmp_path, tiny_llama):
    tiny_llama.config.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelLoadError, match="cannot load model"):
        load_model(str(tmp_path), dtype="float32", progress=False)


def test_corrupt_gguf_is_a_model_load_error(tmp_path):
    path = tmp_path / "broken.Q4_0.gguf"
    path.write_bytes(b"GGUF garbage")
    with pytest.raises(ModelLoadError, match="cannot load model broken"):
        load_model(str(path), progress=False)


def test_dtype_names():
    assert resolve_dtype("float32") is torch.float32
    assert resolve_dtype("bfloat16") is torch.bfloat16
    assert resolve_dtype("auto") in (torch.float32, torch.bfloat16)
    with pytest.raises(ModelLoadError):
        resolve_dtype("float8")


def _save_tiny_tokenizer(directory, vocab_size: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    tokenizer.save_pretrained(directory)


def test_hugging_face_directory_loads_and_runs(
    tmp_path, tiny_llama, hf_greedy_fn, greedy_driver_cls, monkeypatch
):
    from sluiceway.runner.model_runner import TorchModelRunner

    # Loading reads local files only and leaves the hub switches as they were,
    # so a later model named by a hub id is still fetched.
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    tiny_llama.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    _save_tiny_tokenizer(tmp_path, tiny_llama.config.vocab_size)
    loaded = load_model(str(tmp_path), dtype="float32", progress=False)
    assert "HF_HUB_OFFLINE" not in os.environ
    assert loaded.name == tmp_path.name
    assert loaded.eos_token_ids == frozenset({2, 7})
    assert loaded.max_model_len == tiny_llama.config.max_position_embeddings
    prompt = loaded.tokenizer("w5 w17 w99 w4")["input_ids"]
    assert prompt[-4:] == [5, 17, 99, 4]
    runner = TorchModelRunner.from_loaded(loaded, block_size=4, num_blocks=16)
    assert greedy_driver_cls(runner).generate([prompt], 6) == [hf_greedy_fn(tiny_llama, prompt, 6)]


def test_old_float32_conversions_are_deleted_and_no_weights_are_written(tmp_path, monkeypatch):
    """Earlier versions cached a float32 copy of every GGUF model under `gguf/`;
    a load deletes it, and writes only the GGUF's config and tokenizer (small,
    under `gguf-metadata/`, keyed by the header's hash), which later loads read."""
    from sluiceway.runner.checkpoint import gguf_metadata
    from sluiceway.runner.checkpoint.gguf_file import GGUFFile
    from sluiceway.runner.loading import default_model_path

    monkeypatch.setenv("SLUICEWAY_CACHE_DIR", str(tmp_path))
    old = tmp_path / "gguf" / "SmolLM2-135M-Instruct.Q4_1-0123456789abcdef"
    old.mkdir(parents=True)
    (old / "model.safetensors").write_bytes(b"\0" * 1024)
    first = load_model(None, dtype="float32", progress=False)
    assert not (tmp_path / "gguf").exists()
    path = default_model_path()
    entry = gguf_metadata.metadata_dir(path, GGUFFile.open(path).header_digest)
    assert entry is not None and (entry / "config.json").is_file()
    written = sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file())
    assert written < path.stat().st_size / 4  # a tokenizer and a config, no weights
    assert not list(tmp_path.rglob("*.safetensors"))

    monkeypatch.setattr("transformers.AutoConfig.from_pretrained", _only_for(entry))
    again = load_model(None, dtype="float32", progress=False)
    assert again.hf_config.to_dict() | {"_name_or_path": ""} == first.hf_config.to_dict() | {
        "_name_or_path": ""
    }
    chat = [{"role": "user", "content": "Héllo, wörld! 你好 <tag> 1234"}]
    prompts = [
        t.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
        for t in (first.tokenizer, again.tokenizer)
    ]
    assert prompts[0] == prompts[1] and len(prompts[0]) > 10
    assert (again.eos_token_ids, again.max_model_len) == (first.eos_token_ids, first.max_model_len)


def _only_for(entry):
    from transformers import AutoConfig

    real = AutoConfig.from_pretrained

    def from_pretrained(directory, *args, **kwargs):
        assert str(directory) == str(entry), f"read {directory}, not the cached entry"
        return real(directory, *args, **kwargs)

    return from_pretrained


def test_the_cache_can_be_turned_off(monkeypatch, tmp_path):
    from sluiceway.cache_paths import cache_root
    from sluiceway.runner.checkpoint.gguf_metadata import metadata_dir

    monkeypatch.setenv("SLUICEWAY_CACHE_DIR", "off")
    assert metadata_dir(tmp_path / "m.gguf", "ab" * 32) is None
    monkeypatch.setenv("SLUICEWAY_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path
    monkeypatch.delenv("SLUICEWAY_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "sluiceway"


# One of each registry family: streamed from safetensors, no transformers model
# built (the per-expert tensors of qwen3_moe and Mixtral's block_sparse_moe seen
# as the families' stacked ones).
SAFETENSORS_FAMILIES = [
    "llama3-rope", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3", "smollm3",
    "qwen3_moe", "mixtral",
]  # fmt: skip


@pytest.mark.parametrize("name", SAFETENSORS_FAMILIES)
def test_a_sharded_checkpoint_of_another_family_loads_and_runs(
    tmp_path, monkeypatch, name, hf_greedy_fn, greedy_driver_cls
):
    """Shards with their index file, the chat template from the tokenizer, and
    a sliding window (Gemma 3's) that no longer caps the context; the weights go
    from the files to the runner without a transformers model in between."""
    import transformers

    from family_models import tiny
    from sluiceway.runner.model_runner import TorchModelRunner

    model = tiny(name)
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1
    assert (tmp_path / "model.safetensors.index.json").is_file()
    _save_tiny_tokenizer(tmp_path, model.config.vocab_size)

    def no_module(*args, **kwargs):
        raise AssertionError("a transformers model was built")

    with monkeypatch.context() as patch:
        patch.setattr(transformers.PreTrainedModel, "__init__", no_module)
        loaded = load_model(str(tmp_path), dtype="float32", progress=False)
        runner = TorchModelRunner.from_loaded(loaded, block_size=4, num_blocks=32)
    assert loaded.max_model_len == model.config.max_position_embeddings
    assert loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "w5 w6"}], tokenize=False
    ) == "w5 w6 "
    prompt = [5, 17, 99, 4, 8, 15, 16, 23, 42, 9, 9]
    assert greedy_driver_cls(runner).generate([prompt], 12) == [hf_greedy_fn(model, prompt, 12)]


# transformers' GGUF reader maps no `head_dim` for Qwen3 (it takes the config's
# default, 128) and no layer types or soft caps for Gemma (it takes the config
# defaults): the models here keep to those defaults, as the released ones do.
GGUF_CASES = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=128)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(head_dim=16, sliding_window=8)),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(head_dim=16, sliding_window=8, num_hidden_layers=6),  # five local layers, one global
    ),
}


@pytest.mark.parametrize("name", list(GGUF_CASES))
def test_a_gguf_of_another_family_loads_and_runs(tmp_path, monkeypatch, name, hf_greedy_fn, greedy_driver_cls):
    """A float32 GGUF laid out as llama.cpp's converter writes it (Gemma's norms as
    1 + weight) loads back to the model's own weights and generates its tokens."""
    import transformers

    from family_models import BASE
    from gguf_files import VOCAB_SIZE, write_gguf
    from sluiceway.runner.model_runner import TorchModelRunner

    monkeypatch.setenv("SLUICEWAY_CACHE_DIR", str(tmp_path / "cache"))
    config_cls, model_cls, extra = GGUF_CASES[name]
    config = getattr(transformers, config_cls)(**{**BASE, "vocab_size": VOCAB_SIZE, **extra})
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for param_name, p in model.named_parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p)) if "norm" in param_name else p.normal_(0, 0.3)
    write_gguf(model, tmp_path / "tiny.gguf")
    loaded = load_model(str(tmp_path / "tiny.gguf"), dtype="float32", progress=False)
    assert loaded.hf_config.model_type == model.config.model_type
    assert getattr(loaded.hf_config, "layer_types", None) == getattr(model.config, "layer_types", None)
    weights = loaded.state_dict()
    for key, tensor in model.state_dict().items():
        if key == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        torch.testing.assert_close(weights.tensor(key), tensor, rtol=1e-6, atol=1e-6, msg=key)
    prompt = loaded.tokenizer("The capital of France is")["input_ids"]
    assert len(prompt) > 5 and max(prompt) < VOCAB_SIZE
    runner = TorchModelRunner.from_loaded(loaded, block_size=4, num_blocks=32)
    want = hf_greedy_fn(model, prompt, 12)
    assert greedy_driver_cls(runner).generate([prompt], 12) == [want]
