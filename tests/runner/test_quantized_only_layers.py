"""Quantized layers without a dense copy (`Linear(..., dense_copy=False)`, the
runner's default): they hold only their quantized bytes, the quantized kernels
serve every row count, and the values they hold are those a dense copy would hold."""

from __future__ import annotations

import shutil

import pytest
import torch

from sluiceway.runner import linear
from sluiceway.runner.linear import Int4Weight, Int8Weight, Linear
from sluiceway.runner.native import int8_dot as kernel
from sluiceway.runner.native.quantized_matmul_f32 import (
    int4_matmul_f32,
    int8_matmul_f32,
    quantized_matmul_f32_available,
)

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None or not kernel.integer_level(),
    reason="needs a C compiler and a CPU with AVX2 or better",
)


def _weight(out_features: int, in_features: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=gen) * 0.05
    weight[1] = 0.0  # an all-zero row: its scale must not be 0
    return weight.to(dtype)


def _stored_bytes(quantized: Int4Weight | Int8Weight) -> int:
    fields = ("q", "scales", "packed", "native", "scales_and_offsets")
    tensors = [getattr(quantized, f, None) for f in fields]
    total = sum(t.numel() * t.element_size() for t in tensors if t is not None)
    return total + (quantized.tiled.nbytes if quantized.tiled is not None else 0)


@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_unpacked_int4_tiles_are_their_values(scale_dtype):
    """`int8_dot.unpack` gives `(q - 8) * scale + offset` computed in float32,
    rounded once to the dtype asked for, bit for bit: whole, and a run of tiles.
    float16 scales (GGUF's Q4_0) hold no offsets: `(q - 8) * scale`."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randint(0, 16, (40, 96), generator=gen)
    scales = (torch.rand(40, 3, generator=gen) * 0.1 + 1e-3).to(scale_dtype).float()
    offsets = (torch.randn(40, 3, generator=gen) * 0.05).to(scale_dtype).float()
    if scale_dtype == torch.float16:
        offsets = torch.zeros_like(offsets)
    values = ((q.float().view(40, 3, 32) - 8.0) * scales[..., None] + offsets[..., None]).view(
        40, 96
    )
    held = None if scale_dtype == torch.float16 else offsets
    tiled = kernel.pack_int4_tiles(q, scales, held, scale_dtype)
    for dtype in (torch.bfloat16, torch.float32):
        for level in range(kernel.best_level() + 1):  # AVX512's own path, and C's
            got = kernel.unpack(tiled, dtype, level_cap=level)
            assert torch.equal(got, values.to(dtype)), kernel.LEVELS[level]
            rows = kernel.unpack(tiled, dtype, (16, 40), level_cap=level)
            assert torch.equal(rows, values[16:].to(dtype)), kernel.LEVELS[level]
    with pytest.raises(ValueError, match="cannot unpack"):
        kernel.unpack(tiled, torch.float32, (8, 24))


def test_unpacked_int8_tiles_are_their_values():
    """`q * scale` in float32, rounded once, with input features that are not a
    multiple of 32 (the tiles' zero padding is not read back)."""
    gen = torch.Generator().manual_seed(4)
    q = torch.randint(-127, 128, (40, 100), generator=gen, dtype=torch.int8)
    scales = torch.rand(40, generator=gen) * 0.01 + 1e-4
    values = q.float() * scales[:, None]
    tiled = kernel.pack_int8_tiles(q, scales)
    for dtype in (torch.bfloat16, torch.float32):
        assert torch.equal(kernel.unpack(tiled, dtype), values.to(dtype))
        assert torch.equal(kernel.unpack(tiled, dtype, (32, 40)), values[32:].to(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("quantization", ["int4", "int8"])
def test_a_layer_without_a_dense_copy_serves_every_row_count_on_its_kernel(dtype, quantization):
    if dtype == torch.float32 and not quantized_matmul_f32_available():
        pytest.skip("float32's native kernels need AVX2")
    weight = _weight(48, 128, dtype, seed=1)
    bias = torch.randn(48).to(dtype)
    layer = Linear(weight, bias, quantization=quantization, dense_copy=False)
    kept = Linear(weight, bias, quantization=quantization, dense_copy=True)
    quantized = layer.quantized
    assert quantized is not None and quantized.serves_every_row_count()
    assert layer.kind == "quantized" and layer.weight is None
    # its values are the dense copy's, bit for bit
    assert kept.kind == "plain" or kept.kind == "mkldnn"
    dense = (
        kept.weight
        if kept.kind == "plain"
        else torch.ops.mkldnn._linear_pointwise(
            torch.eye(128, dtype=dtype), kept.weight, None, "none", [], ""
        ).T
    )
    assert torch.equal(quantized.values(dtype), dense)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(100, 128, generator=gen).to(dtype)
    assert 100 < linear.DEQUANTIZED_MIN_ROWS
    for rows in (1, 9, 100):
        got = layer(x[:rows])
        if quantized.tiled is not None:
            want = kernel.int8_dot(x[:rows], quantized.tiled)
        elif isinstance(quantized, Int4Weight):
            assert quantized.native is not None
            want = int4_matmul_f32(x[:rows], quantized.native)
        else:
            assert quantized.q is not None
            want = int8_matmul_f32(x[:rows], quantized.q, quantized.scales)
        assert want is not None
        assert torch.equal(got, want + bias)
    # A non-contiguous input is served the same.
    assert torch.equal(layer(x[:9, :].t().contiguous().t()), layer(x[:9]))
    # and it holds only the quantized bytes, well under the dense ones
    assert _stored_bytes(quantized) < 0.6 * weight.numel() * weight.element_size()


def test_a_weight_no_kernel_serves_at_every_row_count_keeps_its_dense_copy():
    """bfloat16 with the int8-activation kernels switched off has only a one-row
    native kernel, so the layer keeps the dense copy whatever it was asked."""
    linear.use_int8_activation_kernels(False)
    try:
        layer = Linear(_weight(32, 64, torch.bfloat16), quantization="int4", dense_copy=False)
    finally:
        linear.use_int8_activation_kernels(None)
    assert layer.quantized is not None and not layer.quantized.serves_every_row_count()
    assert layer.weight is not None and layer.kind != "quantized"


def test_the_int8_head_drops_its_codes_once_tiled():
    """An int8 weight packed into tiles keeps no second copy of its codes."""
    quantized, _ = Int8Weight.quantize(_weight(32, 64, torch.bfloat16), want_values=False)
    assert quantized.tiled is not None and quantized.q is None


@pytest.mark.parametrize("quantization", ["int4", "int8"])
def test_rows_unpacked_by_id_are_the_weights_rows(quantization):
    """An embedding lookup in a tied head's tiles: any ids, repeated, in any order."""
    gen = torch.Generator().manual_seed(5)
    if quantization == "int4":
        q = torch.randint(0, 16, (48, 64), generator=gen)
        scales = torch.rand(48, 2, generator=gen) * 0.1 + 1e-3
        offsets = torch.randn(48, 2, generator=gen) * 0.05
        tiled = kernel.pack_int4_tiles(q, scales, offsets, torch.bfloat16)
    else:
        q8 = torch.randint(-127, 128, (48, 70), generator=gen, dtype=torch.int8)
        tiled = kernel.pack_int8_tiles(q8, torch.rand(48, generator=gen) * 0.01 + 1e-4)
    ids = torch.tensor([47, 0, 17, 17, 31, 16, 5])
    for dtype in (torch.bfloat16, torch.float32):
        whole = kernel.unpack(tiled, dtype)
        for level in range(kernel.best_level() + 1):
            got = kernel.unpack_rows(tiled, ids, dtype, level_cap=level)
            assert torch.equal(got, whole[ids]), kernel.LEVELS[level]
        assert kernel.unpack_rows(tiled, ids[:0], dtype).shape == (0, whole.shape[1])
    with pytest.raises(ValueError, match="outside"):
        kernel.unpack_rows(tiled, torch.tensor([48]), torch.float32)


@pytest.mark.parametrize("quantization", ["int4", "int8"])
def test_long_calls_multiply_by_the_unpacked_values_a_slab_at_a_time(quantization, monkeypatch):
    """From `DEQUANTIZED_MIN_ROWS` rows on (a long prompt), a layer on tiles
    multiplies by its values densely, a slab of output rows at a time (the last
    one short here): the product of the same values, to a bfloat16 rounding."""
    monkeypatch.setattr(linear, "_SLAB_ELEMENTS", 32 * 128)  # slabs of 32 rows
    weight = _weight(80, 128, torch.bfloat16, seed=6)
    bias = torch.randn(80).to(torch.bfloat16)
    layer = Linear(weight, bias, quantization=quantization, dense_copy=False)
    quantized = layer.quantized
    assert quantized is not None and quantized.tiled is not None
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(linear.DEQUANTIZED_MIN_ROWS, 128, generator=gen).to(torch.bfloat16)
    want = torch.nn.functional.linear(x, quantized.values(torch.bfloat16), bias)
    got = layer(x)
    torch.testing.assert_close(got, want, rtol=2**-7, atol=2**-7)
    # not the int8-activation kernel's product, which is further off
    assert not torch.equal(got, kernel.int8_dot(x, quantized.tiled) + bias)
