"""A split GGUF (llama.cpp's gguf-split: `NAME-00001-of-0000N.gguf`, the
metadata in the first part, the tensors shared out) loads from its first part
as the same file unsplit does, and a part given alone or missing is one line
that says what to do."""

from __future__ import annotations

import pytest
import torch
import transformers
from gguf import GGMLQuantizationType

from family_models import BASE
from gguf_files import VOCAB_SIZE, write_gguf
from sluiceway.runner.checkpoint.gguf_file import GGUFFile
from sluiceway.runner.loading import ModelLoadError, load_model
from sluiceway.runner.model_runner import TorchModelRunner

NEW_TOKENS = 6


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(the whole Q4_0 GGUF, its three parts) of one tiny random Llama."""
    config = transformers.LlamaConfig(**{**BASE, "vocab_size": VOCAB_SIZE})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    folder = tmp_path_factory.mktemp("split")
    (folder / "whole").mkdir()
    (folder / "parts").mkdir()
    [whole] = write_gguf(model, folder / "whole" / "tiny.gguf", GGMLQuantizationType.Q4_0)
    count = len(GGUFFile.open(whole).tensors)
    parts = write_gguf(
        model, folder / "parts" / "tiny.gguf", GGMLQuantizationType.Q4_0, split_max_tensors=-(-count // 3)
    )
    return whole, parts


def test_the_parts_are_named_and_shared_out_as_gguf_split_writes_them(files):
    whole, parts = files
    assert [p.name for p in parts] == [f"tiny-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    split = GGUFFile.open(parts[0])
    assert split.parts == 3 and GGUFFile.open(whole).parts == 1
    assert list(split.tensors) == list(GGUFFile.open(whole).tensors)
    for name, stored in GGUFFile.open(whole).tensors.items():
        assert bytes(split.tensors[name].data) == bytes(stored.data), name


def _greedy(path, greedy_driver_cls, monkeypatch, cache) -> list[int]:
    monkeypatch.setenv("SLUICEWAY_CACHE_DIR", str(cache))
    loaded = load_model(str(path), dtype="float32", progress=False)
    prompt = loaded.tokenizer("The capital of France is")["input_ids"]
    # Q4_0 served as stored: the int4 tiles are packed from each part's mapping.
    runner = TorchModelRunner.from_loaded(loaded, block_size=4, num_blocks=32)
    return greedy_driver_cls(runner).generate([prompt], NEW_TOKENS)[0]


def test_a_split_gguf_generates_what_the_whole_file_generates(files, greedy_driver_cls, monkeypatch, tmp_path):
    whole, parts = files
    want = _greedy(whole, greedy_driver_cls, monkeypatch, tmp_path / "a")
    got = _greedy(parts[0], greedy_driver_cls, monkeypatch, tmp_path / "b")
    assert got == want and len(got) == NEW_TOKENS


def _error(path) -> str:
    with pytest.raises(ModelLoadError) as caught:
        load_model(str(path), dtype="float32", progress=False)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_later_part_names_the_first(files):
    _, parts = files
    assert _error(parts[1]).endswith(
        "tiny-00002-of-00003.gguf: part 2 of a 3-part split GGUF: give its first part, "
        "tiny-00001-of-00003.gguf"
    )


def test_a_missing_part_is_named(files, tmp_path):
    _, parts = files
    for part in parts[::2]:  # the first and the last; the second is missing
        (tmp_path / part.name).write_bytes(part.read_bytes())
    message = _error(tmp_path / parts[0].name)
    assert message.endswith("part tiny-00002-of-00003.gguf of this 3-part split GGUF is missing")
    assert str(tmp_path) in message
