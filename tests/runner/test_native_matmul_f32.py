"""The float32 int4 and int8 kernels (AVX2) against the dequantized weights they
read, the `Linear` calls they serve, and where they step aside. The kernels take
eight activation rows per pass over a weight row, so row counts past eight test the
passes and their tails."""

from __future__ import annotations

import shutil

import pytest
import torch

from sluiceway.runner import linear
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


@pytest.fixture(autouse=True)
def _float_activation_kernels():
    """Layers built here take the float-activation kernels this file tests; the
    int8-activation ones, which layers take where the CPU runs them, are
    test_int8_dot.py's."""
    linear.use_int8_activation_kernels(False)
    yield
    linear.use_int8_activation_kernels(None)


def assert_float32_product(got, x, weight, magnitude):
    """`got` is `x @ weight.T` to within the worst-case rounding of float32 sums.

    The kernels and torch's matmul add the same products in different orders, and
    which order torch takes depends on the CPU, so no fixed tolerance holds on every
    machine. The bound is the classic one for a float32 sum of n rounded products,
    gamma(n + 3) * sum |terms| (one rounding for each product, the scale and the bias);
    `magnitude` holds the absolute value of each weight's terms as the kernel adds
    them. A dropped or misplaced product costs far more than that bound.
    """
    exact = x.double() @ weight.double().T
    terms = x.double().abs() @ magnitude.double().T
    n = x.shape[1] + 3
    eps = 2.0**-24
    bound = n * eps / (1 - n * eps) * terms
    error = (got.double() - exact).abs()
    assert bool((error <= bound).all()), f"error {error.max():.3g} over bound {bound.min():.3g}"


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
    q, scales, offsets, _ = _int4(out_features, in_features, seed=in_features + rows)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows))
    got = int4_matmul_f32(x, pack_int4_f32(q, scales, offsets))
    assert got is not None and got.dtype is torch.float32 and got.shape == (rows, out_features)
    # The kernel adds scale * sum(q * x) + (offset - 8 * scale) * sum(x) a group.
    groups = in_features // 32
    scale = scales.repeat_interleave(32, dim=1).double()
    bias = (offsets.double() - 8 * scales.double()).repeat_interleave(32, dim=1)
    exact_weight = (q.double() - 8) * scale + offsets.double().repeat_interleave(32, dim=1)
    assert groups * 32 == in_features
    assert_float32_product(got, x, exact_weight, q.double() * scale + bias.abs())
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
    weight = q.double() * scales.double()[:, None]
    assert_float32_product(got, x, weight, weight.abs())


@pytest.mark.parametrize("quantization", ["int4", "int8"])
def test_float32_linear_uses_them_up_to_its_row_limit_and_the_dense_weight_beyond(quantization):
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(128, 576, generator=gen) * 0.05
    layer = Linear(weight, quantization=quantization, dense_copy=True)
    limit = FLOAT32_QUANTIZED_MAX_ROWS
    assert layer.quantized_max_rows == limit
    quantized = layer.quantized
    assert isinstance(quantized, (Int4Weight, Int8Weight))
    if isinstance(quantized, Int4Weight):
        assert quantized.native is not None
    x = torch.randn(limit + 1, 576, generator=gen)
    few = layer(x[:limit])
    direct = (
        int4_matmul_f32(x[:limit], quantized.native)
        if isinstance(quantized, Int4Weight)
        else int8_matmul_f32(x[:limit], quantized.q, quantized.scales)
    )
    assert direct is not None and torch.equal(few, direct)
    if isinstance(quantized, Int4Weight):
        # Each group's terms are at most 15 * scale + |offset - 8 * scale| (q <= 15).
        scale, offset = quantized.scales_and_offsets.double().unbind(-1)
        group_terms = 15 * scale + (offset - 8 * scale).abs()  # [groups, out]
        magnitude = group_terms.T.repeat_interleave(quantized.group_size, dim=1)
    else:
        magnitude = layer.weight.abs()
    assert_float32_product(few, x[:limit], layer.weight, magnitude)
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
