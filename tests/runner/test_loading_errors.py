"""A GGUF that cannot be served is one line naming the file and the field (or
tensor) at fault, and `sluiceway serve` exits non-zero with that line and no
traceback."""

from __future__ import annotations

import struct

import pytest
import torch
import transformers

from family_models import BASE
from gguf_files import VOCAB_SIZE, write_gguf
from sluiceway.runner.loading import ModelLoadError, load_model


@pytest.fixture(scope="module")
def good_gguf(tmp_path_factory) -> bytes:
    """The bytes of a tiny float32 Llama GGUF that loads."""
    config = transformers.LlamaConfig(**{**BASE, "vocab_size": VOCAB_SIZE})
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(transformers.LlamaForCausalLM(config), path)
    return path.read_bytes()


def _replace_after(data: bytes, anchor: bytes, old: bytes, new: bytes) -> bytes:
    at = data.index(old, data.index(anchor))
    return data[:at] + new + data[at + len(old) :]


def _error(path) -> str:
    with pytest.raises(ModelLoadError) as caught:
        load_model(str(path), dtype="float32", progress=False)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message
    return message


def test_a_truncated_file_names_the_tensor_that_is_cut(tmp_path, good_gguf):
    path = tmp_path / "cut.gguf"
    path.write_bytes(good_gguf[: len(good_gguf) - 1000])
    assert "truncated: tensor output.weight ends at byte" in _error(path)


def test_a_truncated_header_says_where_it_ends(tmp_path, good_gguf):
    path = tmp_path / "header.gguf"
    path.write_bytes(good_gguf[:2000])
    assert "truncated GGUF header (ends inside metadata tokenizer." in _error(path)


def test_a_file_that_is_not_a_gguf(tmp_path):
    path = tmp_path / "noise.gguf"
    path.write_bytes(b"\0" * 64)
    assert "not a GGUF file" in _error(path)


def test_an_unknown_tensor_type_names_the_tensor(tmp_path, good_gguf):
    name = b"output_norm.weight"
    at = good_gguf.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    dims = struct.unpack_from("<I", good_gguf, at)[0]
    type_at = at + 4 + 8 * dims
    path = tmp_path / "type.gguf"
    path.write_bytes(good_gguf[:type_at] + struct.pack("<I", 99) + good_gguf[type_at + 4 :])
    assert "tensor output_norm.weight: unknown tensor type 99" in _error(path)


def test_an_architecture_nobody_knows_names_the_field(tmp_path, good_gguf):
    path = tmp_path / "arch.gguf"
    path.write_bytes(_replace_after(good_gguf, b"general.architecture", b"llama", b"zzzzz"))
    assert "metadata general.architecture" in _error(path)


def test_a_tokenizer_that_cannot_be_built_names_the_field(tmp_path, good_gguf):
    path = tmp_path / "tokenizer.gguf"
    path.write_bytes(_replace_after(good_gguf, b"tokenizer.ggml.model", b"gpt2", b"zzzz"))
    assert "metadata tokenizer.ggml.model: cannot build the tokenizer" in _error(path)


def test_serve_prints_one_line_and_exits_non_zero(tmp_path, good_gguf, capsys):
    from sluiceway.cli import main

    path = tmp_path / "cut.gguf"
    path.write_bytes(good_gguf[:-1000])
    assert main(["serve", str(path), "--port", "0"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("sluiceway: ")]
    assert len(lines) == 1 and "truncated: tensor output.weight" in lines[0]
    assert "Traceback" not in err
