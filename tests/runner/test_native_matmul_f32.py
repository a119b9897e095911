"""The float32 int4 and int8 kernels (AVX2) against the dequantized weights they
read, the `Linear` calls they serve, and where they step aside. The kernels take
eight activation rows per pass over a weight row, so row counts past eight test the
passes and their tails."""

from __future__ import annotations

import shutil

import pytest
import torch

from sluiceway.runner.linear import (
    FLOAT32_HEAD_QUANTIZED_MAX_ROWS,
    FLOAT32_QUANTIZED_MAX_ROWS,
    Int4Weight,
    Int8Weight,
    Linear,
    default_quantized_max_rows,
)
from sluiceway.runner.native.quantized_matmul_f32 import (
    int4_matmul_f32,
    int8_matmul_f32,
    pack_int4_f32,
    quantized_matmul_f32_available,
)

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None or not quantized_matmul_f32_available(),
    reason="needs a C compiler and a CPU with AVX2 and FMA",
)


def _int4(out_features: int, in_features: int, seed: int):
    """Random q, float32 scales and offsets, and the weight `(q - 8) * scale + offset`."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (out_features, in_features), generator=gen)
    q[0, :32] = 15  # the extremes of both nibbles
    q[0, 32:64] = 0
    groups = in_features // 32
    scales = torch.rand(out_features, groups, generator=gen) * 0.1 + 1e-3
    offsets = torch.randn(out_features, groups, generator=gen) * 0.1
    weight = (q.float() - 8.0).view(out_features, groups, 32) * scales[..., None]
    return q, scales, offsets, (weight + offsets[..., None]).view(out_features, in_features)


# 37 rows: not a multiple of the thread count; 1536 inputs: more than 8 groups of
# biases; every row count of one pass, and two and three passes with tails.
@pytest.mark.parametrize(("out_features", "in_features"), [(37, 64), (96, 576), (40, 1536)])
@pytest.mark.parametrize("rows", [*range(1, 9), 13, 16, 20])
def test_int4_is_the_product_with_the_dequantized_weight(out_features, in_features, rows):
    q, scales, offsets, weight = _int4(out_features, in_features, seed=in_features + rows)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows))
    got = int4_matmul_f32(x, pack_int4_f32(q, scales, offsets))
    assert got is not None and got.dtype is torch.float32 and got.shape == (rows, out_features)
    # float32 sums of up to 1536 products, in another order: a few units of 1e-5.
    torch.testing.assert_close(got, x @ weight.T, rtol=1e-4, atol=1e-4)
    # Each row's product is the one it gets alone: batch composition changes nothing.
    alone = int4_matmul_f32(x[-1:].contiguous(), pack_int4_f32(q, scales, offsets))
    assert alone is not None and torch.equal(got[-1:], alone)


@pytest.mark.parametrize(("out_features", "in_features"), [(37, 96), (128, 576)])
@pytest.mark.parametrize("rows", [1, 3, 8, 21])
def test_int8_is_the_product_with_the_dequantized_weight(out_features, in_features, rows):
    gen = torch.Generator().manual_seed(out_features + rows)
    q = torch.randint(-127, 128, (out_features, in_features), generator=gen).to(torch.int8)
    q[0], q[1] = -127, 127
    scales = torch.rand(out_features, generator=gen) * 0.01 + 1e-4
    x = torch.randn(rows, in_features, generator=gen)
    got = int8_matmul_f32(x, q, scales)
    assert got is not None and got.shape == (rows, out_features)
    torch.testing.assert_close(got, x @ (q.float() * scales[:, None]).T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("quantization", ["int4", "int8"])
def test_float32_linear_uses_them_up_to_its_row_limit_and_the_dense_weight_beyond(quantization):
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(128, 576, generator=gen) * 0.05
    layer = Linear(weight, quantization=quantization)
    limit = FLOAT32_QUANTIZED_MAX_ROWS
    assert layer.quantized_max_rows == limit
    quantized = layer.quantized
    assert isinstance(quantized, (Int4Weight, Int8Weight))
    if isinstance(quantized, Int4Weight):
        assert quantized.native is not None
    x = torch.randn(limit + 1, 576, generator=gen)
    dense = x @ layer.weight.T  # the dequantized values, as the larger calls use them
    few = layer(x[:limit])
    direct = (
        int4_matmul_f32(x[:limit], quantized.native)
        if isinstance(quantized, Int4Weight)
        else int8_matmul_f32(x[:limit], quantized.q, quantized.scales)
    )
    assert direct is not None and torch.equal(few, direct)
    torch.testing.assert_close(few, dense[:limit], rtol=1e-5, atol=1e-5)
    assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight))


def test_row_limits_by_dtype_and_role():
    assert default_quantized_max_rows(torch.float32) == FLOAT32_QUANTIZED_MAX_ROWS
    assert default_quantized_max_rows(torch.float32, output_head=True) == (
        FLOAT32_HEAD_QUANTIZED_MAX_ROWS
    )
    assert default_quantized_max_rows(torch.bfloat16, output_head=True) == 8


def test_what_they_do_not_take_is_left_to_the_caller():
    q, scales, offsets, _ = _int4(16, 64, seed=1)
    packed = pack_int4_f32(q, scales, offsets)
    assert int4_matmul_f32(torch.randn(0, 64), packed) is None
    assert int4_matmul_f32(torch.randn(1, 64).to(torch.bfloat16), packed) is None
    assert int4_matmul_f32(torch.randn(1, 128)[:, ::2], packed) is None
    with pytest.raises(ValueError, match="disagree"):
        int4_matmul_f32(torch.randn(1, 128), packed)
    q8 = torch.zeros(4, 40, dtype=torch.int8)  # not whole groups of 32
    assert int8_matmul_f32(torch.zeros(1, 40), q8, torch.ones(4)) is None
    q8 = torch.zeros(4, 64, dtype=torch.int8)
    assert int8_matmul_f32(torch.zeros(1, 64), q8, torch.ones(4, dtype=torch.bfloat16)) is None
    with pytest.raises(ValueError, match="disagree"):
        int8_matmul_f32(torch.zeros(1, 64), q8, torch.ones(5))
    # bfloat16 models keep the bfloat16 kernel's packing (or none), never this one's.
    bf16 = Int4Weight.quantize(torch.randn(16, 64).to(torch.bfloat16))[0]
    assert bf16.native is None or bf16.native.shape[1] == 32 + 4 * 2
