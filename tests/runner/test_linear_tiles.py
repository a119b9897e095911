"""Quantized `Linear` layers on the int8-activation kernels: packed at construction,
whichever way the quantized weight was built, and serving the rows the quantized
path gets."""

from __future__ import annotations

import shutil

import pytest
import torch

from sluiceway.runner import linear
from sluiceway.runner.linear import Int4Weight, Int8Weight, Linear
from sluiceway.runner.native import int8_dot as kernel

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None or not kernel.integer_level(),
    reason="needs a C compiler and a CPU with AVX2 or better",
)


@pytest.fixture(autouse=True)
def _tiles_for_both_dtypes():
    """float32 layers take the kernel only when asked (see `linear._tiles_wanted`):
    asked here, so both dtypes' packings are tested."""
    linear.use_int8_activation_kernels(True)
    yield
    linear.use_int8_activation_kernels(None)


def test_by_default_bfloat16_layers_take_the_kernel_and_float32_ones_keep_theirs():
    linear.use_int8_activation_kernels(None)
    for dtype, tiled in ((torch.bfloat16, True), (torch.float32, False)):
        for quantization in ("int4", "int8"):
            layer = Linear(torch.randn(32, 64).to(dtype), quantization=quantization)
            assert isinstance(layer.quantized, (Int4Weight, Int8Weight))
            assert (layer.quantized.tiled is not None) == tiled


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("quantization", ["int4", "int8"])
def test_layers_take_the_kernel_for_the_rows_the_quantized_path_gets(dtype, quantization):
    gen = torch.Generator().manual_seed(1)
    weight = (torch.randn(48, 128, generator=gen) * 0.05).to(dtype)
    layer = Linear(weight, quantization=quantization, dense_copy=True)
    quantized = layer.quantized
    assert isinstance(quantized, (Int4Weight, Int8Weight)) and quantized.tiled is not None
    if isinstance(quantized, Int4Weight):
        assert quantized.native is None  # not kept beside the tiles
    limit = layer.quantized_max_rows
    x = torch.randn(limit + 1, 128, generator=gen).to(dtype)
    for rows in (1, limit):
        got = layer(x[:rows])
        assert torch.equal(got, kernel.int8_dot(x[:rows], quantized.tiled))
    # Past the limit the dense copy of the same weight values serves.
    assert torch.equal(layer(x), torch.nn.functional.linear(x, _dense(layer, weight)))


def _dense(layer: Linear, weight: torch.Tensor) -> torch.Tensor:
    if layer.kind == "plain":
        return layer.weight
    return torch.ops.mkldnn._linear_pointwise(
        torch.eye(weight.shape[1], dtype=weight.dtype), layer.weight, None, "none", [], ""
    ).T


def test_switched_off_layers_keep_the_float_kernels():
    linear.use_int8_activation_kernels(False)
    layer = Linear(torch.randn(32, 64).to(torch.bfloat16), quantization="int4")
    assert isinstance(layer.quantized, Int4Weight) and layer.quantized.tiled is None


def test_int8_weights_built_from_their_parts_are_packed():
    q = torch.randint(-127, 128, (20, 40), dtype=torch.int8)
    scales = torch.rand(20).to(torch.bfloat16)
    weight = Int8Weight(q=q, scales=scales)
    assert weight.tiled is not None
    assert torch.equal(weight.tiled.data, kernel.pack_int8_tiles(q, scales).data)
