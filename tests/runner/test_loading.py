"""Model loading: the default GGUF, Hugging Face directories, and clear errors."""

from __future__ import annotations

import json

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
    tmp_path, tiny_llama, hf_greedy_fn, greedy_driver_cls
):
    from sluiceway.runner.model_runner import TorchModelRunner

    tiny_llama.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    _save_tiny_tokenizer(tmp_path, tiny_llama.config.vocab_size)
    loaded = load_model(str(tmp_path), dtype="float32", progress=False)
    assert loaded.name == tmp_path.name
    assert loaded.eos_token_ids == frozenset({2, 7})
    assert loaded.max_model_len == tiny_llama.config.max_position_embeddings
    prompt = loaded.tokenizer("w5 w17 w99 w4")["input_ids"]
    assert prompt[-4:] == [5, 17, 99, 4]
    runner = TorchModelRunner.from_loaded(loaded, block_size=4, num_blocks=16)
    assert greedy_driver_cls(runner).generate([prompt], 6) == [hf_greedy_fn(tiny_llama, prompt, 6)]


@pytest.mark.slow
def test_a_gguf_model_is_converted_once_then_loaded_from_the_cache(tmp_path, monkeypatch):
    """The cached directory gives the same model: weights, config, tokenizer, chat
    template, EOS ids and context length; the second load never parses the GGUF."""
    from sluiceway.runner import loading

    monkeypatch.setenv("SLUICEWAY_CACHE_DIR", str(tmp_path / "cache"))
    direct = load_model(None, dtype="float32", progress=False)
    cached_dir = loading.converted_gguf_dir(loading.default_model_path())
    assert cached_dir is not None and (cached_dir / "config.json").is_file()
    assert cached_dir.parent == tmp_path / "cache" / "gguf"

    sources = []
    real_load_parts = loading._load_parts

    def spy(directory, gguf, dtype, progress):
        sources.append(gguf)
        return real_load_parts(directory, gguf, dtype, progress)

    monkeypatch.setattr(loading, "_load_parts", spy)
    again = load_model(None, dtype="float32", progress=False)
    assert sources == [None]  # a Hugging Face directory, not the GGUF
    want, got = direct.state_dict(), again.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    where_and_how = {"_name_or_path", "dtype"}  # the source path; None vs float32
    want_config = {k: v for k, v in direct.hf_config.to_dict().items() if k not in where_and_how}
    got_config = {k: v for k, v in again.hf_config.to_dict().items() if k not in where_and_how}
    assert got_config == want_config
    assert (again.name, again.eos_token_ids, again.max_model_len) == (
        direct.name,
        direct.eos_token_ids,
        direct.max_model_len,
    )
    chat = [{"role": "user", "content": "Héllo, wörld! 你好 <tag> 1234"}]
    assert again.tokenizer.chat_template == direct.tokenizer.chat_template
    prompts = [
        t.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
        for t in (direct.tokenizer, again.tokenizer)
    ]
    assert prompts[0] == prompts[1] and len(prompts[0]) > 10
    ids = [0, 1, 2, 300, 4000, *prompts[0]]
    assert again.tokenizer.decode(ids) == direct.tokenizer.decode(ids)


def test_the_cache_can_be_turned_off(monkeypatch, tmp_path):
    from sluiceway.cache_paths import cache_root
    from sluiceway.runner import loading

    monkeypatch.setenv("SLUICEWAY_CACHE_DIR", "off")
    assert loading.converted_gguf_dir(loading.default_model_path()) is None
    monkeypatch.setenv("SLUICEWAY_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path
    monkeypatch.delenv("SLUICEWAY_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "sluiceway"


def test_a_second_writer_leaves_the_first_entry_and_no_debris(tmp_path, tiny_llama, tokenizer):
    from sluiceway.runner import loading

    target = tmp_path / "gguf" / "model-abc"
    loading._save_converted(target, tokenizer, tiny_llama)
    first = (target / "model.safetensors").read_bytes()
    loading._save_converted(target, tokenizer, tiny_llama)  # lost the race: no error
    assert (target / "model.safetensors").read_bytes() == first
    assert [p.name for p in (tmp_path / "gguf").iterdir()] == ["model-abc"]
    loaded = load_model(str(target), dtype="float32", progress=False)
    want = tiny_llama.state_dict()
    assert all(torch.equal(loaded.state_dict()[k], want[k]) for k in want)


def test_a_damaged_cache_entry_is_converted_again(tmp_path, monkeypatch):
    from sluiceway.runner import loading

    monkeypatch.setenv("SLUICEWAY_CACHE_DIR", str(tmp_path))
    gguf = tmp_path / "model.Q4_0.gguf"
    gguf.write_bytes(b"GGUF")
    entry = loading.converted_gguf_dir(gguf)
    assert entry is not None
    entry.mkdir(parents=True)
    (entry / "config.json").write_text("{not json")
    calls, saved = [], []

    class Module:
        def to(self, dtype):
            return ("module in", dtype)

    def fake_load_parts(directory, gguf_name, dtype, progress):
        calls.append((directory, gguf_name, dtype))
        if gguf_name is None:
            raise OSError("damaged entry")
        return "config", "tokenizer", Module()

    monkeypatch.setattr(loading, "_load_parts", fake_load_parts)
    monkeypatch.setattr(loading, "_save_converted", lambda t, tok, mod: saved.append(t))
    result = loading._load_gguf(tmp_path, gguf.name, torch.bfloat16, False)
    assert result == ("config", "tokenizer", ("module in", torch.bfloat16))
    assert calls == [(entry, None, torch.bfloat16), (tmp_path, gguf.name, torch.float32)]
    assert saved == [entry] and not entry.exists()  # the damaged entry was removed


@pytest.mark.parametrize("name", ["gemma3", "qwen3_moe"])
def test_a_sharded_checkpoint_of_another_family_loads_and_runs(
    tmp_path, name, hf_greedy_fn, greedy_driver_cls
):
    """Shards with their index file, the chat template from the tokenizer, and
    a sliding window (Gemma 3's) that no longer caps the context."""
    from family_models import tiny
    from sluiceway.runner.model_runner import TorchModelRunner

    model = tiny(name)
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1
    assert (tmp_path / "model.safetensors.index.json").is_file()
    _save_tiny_tokenizer(tmp_path, model.config.vocab_size)
    loaded = load_model(str(tmp_path), dtype="float32", progress=False)
    assert loaded.max_model_len == model.config.max_position_embeddings
    assert loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "w5 w6"}], tokenize=False
    ) == "w5 w6 "
    prompt = [5, 17, 99, 4, 8, 15, 16, 23, 42, 9, 9]
    runner = TorchModelRunner.from_loaded(loaded, block_size=4, num_blocks=32)
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
        torch.testing.assert_close(weights[key], tensor, rtol=1e-6, atol=1e-6, msg=key)
    prompt = loaded.tokenizer("The capital of France is")["input_ids"]
    assert len(prompt) > 5 and max(prompt) < VOCAB_SIZE
    runner = TorchModelRunner.from_loaded(loaded, block_size=4, num_blocks=32)
    want = hf_greedy_fn(model, prompt, 12)
    assert greedy_driver_cls(runner).generate([prompt], 12) == [want]
