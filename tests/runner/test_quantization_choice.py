"""`--quantization auto`: the path follows the GGUF's stored linear-weight types,
decided by the majority of their parameters, where the native kernels serve it;
float weights, CUDA and CPUs without the native kernels stay unquantized."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

from sluiceway.runner.quantization_choice import (
    choose_quantization,
    gguf_linear_weight_types,
    path_for_type,
)

Q = GGMLQuantizationType
COLUMNS = 256  # a whole number of blocks for every type (K-quants: 256)


def _write_gguf(path: Path, tensors: list[tuple[str, GGMLQuantizationType, int]]) -> Path:
    """A GGUF holding only a tensor index and zero bytes: `(name, type, rows)` of
    `COLUMNS` columns each. The types are what is under test, not the values."""
    writer = GGUFWriter(path, "llama")
    for name, kind, rows in tensors:
        if kind in (Q.F32, Q.F16):
            dtype = np.float32 if kind == Q.F32 else np.float16
            writer.add_tensor(name, np.zeros((rows, COLUMNS), dtype=dtype))
        else:
            block, size = GGML_QUANT_SIZES[kind]
            data = np.zeros((rows, COLUMNS // block * size), dtype=np.uint8)
            writer.add_tensor(name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _layer(
    kind: GGMLQuantizationType, i: int = 0, rows: int = 32
) -> list[tuple[str, GGMLQuantizationType, int]]:
    names = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
    return [(f"blk.{i}.{n}.weight", kind, rows) for n in names]


def test_only_the_layers_linear_weights_are_counted(tmp_path):
    path = _write_gguf(
        tmp_path / "m.gguf",
        [*_layer(Q.Q4_1), ("blk.0.attn_norm.weight", Q.F32, 1), ("token_embd.weight", Q.Q8_0, 64)],
    )
    assert gguf_linear_weight_types(path) == {"Q4_1": 7 * 32 * COLUMNS}


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        (Q.Q4_0, "int4"),
        (Q.Q4_1, "int4"),
        (Q.Q4_K, "int4"),
        (Q.Q5_K, "int8"),
        (Q.Q8_0, "int8"),
        (Q.Q6_K, "int8"),
        (Q.F16, None),
        (Q.F32, None),
    ],
)
def test_auto_serves_a_gguf_on_the_path_its_weights_are_stored_in(tmp_path, kind, expected):
    path = _write_gguf(tmp_path / "m.gguf", _layer(kind))
    choice = choose_quantization("auto", device="cpu", gguf_path=path, native_kernels=True)
    assert choice.quantization == expected
    assert kind.name in choice.reason


def test_the_majority_of_parameters_decides_a_mixed_file(tmp_path):
    # A Q4_K_M-style mix: most layers 4-bit, a few tensors 6-bit but larger.
    tensors = [*_layer(Q.Q4_K, 0, rows=32), *_layer(Q.Q6_K, 1, rows=16)]
    path = _write_gguf(tmp_path / "mixed.gguf", tensors)
    assert (
        choose_quantization("auto", device="cpu", gguf_path=path, native_kernels=True).quantization
        == "int4"
    )
    tensors = [*_layer(Q.Q4_K, 0, rows=16), *_layer(Q.Q6_K, 1, rows=48)]
    path = _write_gguf(tmp_path / "mostly6.gguf", tensors)
    assert (
        choose_quantization("auto", device="cpu", gguf_path=path, native_kernels=True).quantization
        == "int8"
    )


def test_auto_keeps_float_directories_and_cuda_unquantized(tmp_path):
    path = _write_gguf(tmp_path / "m.gguf", _layer(Q.Q4_1))
    assert (
        choose_quantization("auto", device="cpu", gguf_path=None, native_kernels=True).quantization
        is None
    )
    on_cuda = choose_quantization("auto", device="cuda", gguf_path=path, native_kernels=False)
    assert on_cuda.quantization is None and "CPU only" in on_cuda.reason


def test_auto_stays_unquantized_without_the_native_kernels(tmp_path):
    path = _write_gguf(tmp_path / "m.gguf", _layer(Q.Q4_1))
    choice = choose_quantization("auto", device="cpu", gguf_path=path, native_kernels=False)
    assert choice.quantization is None
    assert "Q4_1" in choice.reason and "AVX2+FMA" in choice.reason


def test_explicit_requests_are_kept_as_asked(tmp_path):
    path = _write_gguf(tmp_path / "m.gguf", _layer(Q.Q4_1))
    assert (
        choose_quantization("none", device="cpu", gguf_path=path, native_kernels=True).quantization
        is None
    )
    assert (
        choose_quantization(None, device="cpu", gguf_path=path, native_kernels=True).quantization
        is None
    )
    assert (
        choose_quantization("int8", device="cpu", gguf_path=path, native_kernels=True).quantization
        == "int8"
    )
    slow = choose_quantization("int4", device="cpu", gguf_path=path, native_kernels=False)
    assert slow.quantization == "int4" and "slow here" in slow.reason
    with pytest.raises(ValueError, match="int3"):
        choose_quantization("int3", device="cpu", gguf_path=path, native_kernels=True)


def test_every_ggml_type_has_a_path():
    # A new GGML type never breaks loading: it maps somewhere, floats to None.
    for kind in Q:
        assert path_for_type(kind.name) in (None, "int8", "int4")
    assert path_for_type("BF16") is None
