"""The native int4 and int8 matrix-vector kernels against the dequantized weights
they read and against torch's kernels, and where they step aside."""

from __future__ import annotations

import shutil

import pytest
import torch

from sluiceway.runner import linear
from sluiceway.runner.linear import Int4Weight, Int8Weight, Linear
from sluiceway.runner.native.quantized_matvec import (
    int4_matvec,
    int4_matvec_available,
    int8_matvec,
    pack_int4,
)

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None or not int4_matvec_available(64),
    reason="needs a C compiler and a CPU with AVX512-BF16",
)


@pytest.fixture(autouse=True)
def _float_activation_kernels():
    """Layers built here take the float-activation kernels this file tests; the
    int8-activation ones, which layers take where the CPU runs them, are
    test_int8_dot.py's."""
    linear.use_int8_activation_kernels(False)
    yield
    linear.use_int8_activation_kernels(None)


def _quantized(out_features: int, in_features: int, seed: int):
    """Random q, scales and offsets (bfloat16 values) and the weight they stand for."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (out_features, in_features), generator=gen)
    groups = in_features // 32
    scales = (torch.rand(out_features, groups, generator=gen) * 0.1 + 1e-3).to(torch.bfloat16)
    offsets = (torch.randn(out_features, groups, generator=gen) * 0.1).to(torch.bfloat16)
    weight = (q.float() - 8.0).view(out_features, groups, 32) * scales.float()[..., None]
    weight = (weight + offsets.float()[..., None]).view(out_features, in_features)
    return q, scales, offsets, weight


# 37 rows: each thread's share ends in rows the kernel takes one at a time; 1536
# inputs: groups past the first 16 (the offsets are summed 16 groups at a time).
@pytest.mark.parametrize(("out_features", "in_features"), [(37, 64), (96, 576), (40, 1536)])
def test_matvec_is_the_product_with_the_dequantized_weight(out_features, in_features):
    q, scales, offsets, weight = _quantized(out_features, in_features, seed=in_features)
    x = torch.randn(1, in_features).to(torch.bfloat16)
    got = int4_matvec(x, pack_int4(q, scales, offsets))
    assert got is not None and got.dtype is torch.bfloat16 and got.shape == (1, out_features)
    want = x.float() @ weight.T  # float32 sums of the same exact products
    torch.testing.assert_close(got.float(), want, rtol=2**-7, atol=1e-3)


def test_bfloat16_int4_linear_uses_it_for_one_row_and_agrees_with_torchs_kernel():
    gen = torch.Generator().manual_seed(5)
    weight = (torch.randn(128, 576, generator=gen) * 0.05).to(torch.bfloat16)
    layer = Linear(weight, quantization="int4")
    quantized = layer.quantized
    assert isinstance(quantized, Int4Weight) and quantized.native is not None
    x = torch.randn(1, 576, generator=gen).to(torch.bfloat16)
    native = layer(x)
    by_torch = torch.ops.aten._weight_int4pack_mm_for_cpu(
        x, quantized.packed, quantized.group_size, quantized.scales_and_offsets
    )
    torch.testing.assert_close(native.float(), by_torch.float(), rtol=2**-7, atol=1e-3)
    # Two rows go to torch's kernel, row for row the same numbers as one row each.
    pair = layer(torch.cat([x, x]))
    torch.testing.assert_close(pair[1:].float(), native.float(), rtol=2**-7, atol=1e-3)


def test_what_it_does_not_take_is_left_to_the_caller():
    q, scales, offsets, _ = _quantized(16, 64, seed=1)
    packed = pack_int4(q, scales, offsets)
    assert int4_matvec(torch.randn(2, 64).to(torch.bfloat16), packed) is None
    assert int4_matvec(torch.randn(1, 64), packed) is None
    assert int4_matvec(torch.randn(1, 128).to(torch.bfloat16)[:, ::2], packed) is None
    with pytest.raises(ValueError, match="disagree"):
        int4_matvec(torch.randn(1, 128).to(torch.bfloat16), packed)
    with pytest.raises(ValueError, match="divisible by 64"):
        pack_int4(torch.zeros(16, 96, dtype=torch.int64), scales[:, :3], offsets[:, :3])
    assert not int4_matvec_available(96)
    # float32 models get the float32 kernel's packing (float32 scales), not this one's.
    float32 = Int4Weight.quantize(torch.randn(16, 64))[0].native
    assert float32 is None or float32.shape[1] == 32 + 8 * 2


# 37 rows: tails of rows taken one at a time; 96 inputs: not a multiple of 64.
@pytest.mark.parametrize(("out_features", "in_features"), [(37, 96), (128, 576), (40, 1536)])
def test_int8_matvec_is_the_product_with_the_dequantized_weight(out_features, in_features):
    gen = torch.Generator().manual_seed(out_features)
    q = torch.randint(-127, 128, (out_features, in_features), generator=gen).to(torch.int8)
    q[0] = -127  # the extremes of both nibbles
    q[1] = 127
    scales = (torch.rand(out_features, generator=gen) * 0.01 + 1e-4).to(torch.bfloat16)
    x = torch.randn(1, in_features, generator=gen).to(torch.bfloat16)
    got = int8_matvec(x, q, scales)
    assert got is not None and got.dtype is torch.bfloat16 and got.shape == (1, out_features)
    want = x.float() @ (q.float() * scales.float()[:, None]).T
    torch.testing.assert_close(got.float(), want, rtol=2**-7, atol=1e-4)
    by_torch = torch._weight_int8pack_mm(x, q, scales)
    torch.testing.assert_close(got.float(), by_torch.float(), rtol=2**-7, atol=1e-4)


def test_int8_linear_uses_it_for_one_row_and_leaves_the_rest_to_torch():
    gen = torch.Generator().manual_seed(6)
    weight = (torch.randn(64, 96, generator=gen) * 0.05).to(torch.bfloat16)
    layer = Linear(weight, quantization="int8")
    quantized = layer.quantized
    assert isinstance(quantized, Int8Weight)
    x = torch.randn(1, 96, generator=gen).to(torch.bfloat16)
    one = layer(x)
    assert torch.equal(one, int8_matvec(x, quantized.q, quantized.scales))
    pair = layer(torch.cat([x, x]))
    torch.testing.assert_close(pair[1:].float(), one.float(), rtol=2**-7, atol=1e-4)
    # What the kernel does not take: two rows, float32, a width that is not whole
    # groups of 32, int8 scales of another dtype.
    assert int8_matvec(torch.cat([x, x]), quantized.q, quantized.scales) is None
    assert int8_matvec(x.float(), quantized.q, quantized.scales) is None
    narrow = torch.zeros(4, 40, dtype=torch.int8)
    assert int8_matvec(torch.zeros(1, 40, dtype=torch.bfloat16), narrow, quantized.scales[:4]) is None
    assert int8_matvec(x, quantized.q, quantized.scales.float()) is None
    with pytest.raises(ValueError, match="disagree"):
        int8_matvec(x, quantized.q, quantized.scales[:5])
