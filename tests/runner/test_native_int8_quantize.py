"""`int8_dot.quantize_rows` (C) gives `Int8Weight.quantize`'s torch codes and
scales bit for bit: rows of every magnitude, an all-zero row, values that fall
half way between two codes, widths that are not a multiple of a block."""

from __future__ import annotations

import pytest
import torch

from sluiceway.runner.linear import Int8Weight, _quantize_rows
from sluiceway.runner.native import int8_dot

pytestmark = pytest.mark.skipif(not int8_dot.available(), reason="the int8_dot library does not build here")


def _weights(dtype: torch.dtype, rows: int, cols: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(rows * cols)
    magnitudes = torch.logspace(-36, 30, rows, dtype=torch.float64)
    w = (torch.randn(rows, cols, generator=gen, dtype=torch.float64) * magnitudes[:, None]).to(dtype)
    w[rows // 2] = 0
    # Half way between codes: after the row's scale is known, weight j is (j + 0.5) * scale.
    row = 3
    scale = _quantize_rows(w[row : row + 1], None)[1].float()
    steps = torch.arange(cols, dtype=torch.float32) % 120 - 60 + 0.5
    w[row] = (steps * scale).to(dtype)
    w[row, 0] = (127 * scale).to(dtype)
    return w


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("rows", "cols"), [(1, 64), (37, 100), (200, 576)])
def test_the_c_quantizer_gives_torchs_codes_and_scales(dtype, rows, cols):
    w = _weights(dtype, max(rows, 5), cols)[:rows].contiguous()
    native = int8_dot.quantize_rows(w)
    assert native is not None
    want_q, want_scales = _quantize_rows(w, None)
    q, scales = native
    assert scales.dtype == dtype
    assert torch.equal(scales, want_scales)
    assert torch.equal(q, want_q)


def test_quantize_takes_the_c_path_and_its_values_are_the_codes_times_the_scales():
    w = _weights(torch.float32, 40, 96)
    quantized, values = Int8Weight.quantize(w)
    want_q, want_scales = _quantize_rows(w, None)
    assert torch.equal(quantized.scales, want_scales)
    assert torch.equal(values, want_q.float() * want_scales[:, None])
    # A slice of a row-parallel weight keeps torch's path with the whole rows' maxima.
    sliced, _ = Int8Weight.quantize(w[:, :48].contiguous(), w.abs().amax(dim=1), want_values=False)
    assert torch.equal(sliced.scales, want_scales)


@pytest.mark.parametrize(("rows", "cols"), [(1, 32), (17, 100), (64, 576)])
def test_int8_tiles_packed_in_c_are_torchs_bytes(rows, cols, monkeypatch):
    """`pack_int8_tiles` in one C pass and through torch's permutes: the same
    bytes, padding rows and columns included."""
    gen = torch.Generator().manual_seed(rows + cols)
    q = torch.randint(-127, 128, (rows, cols), dtype=torch.int8, generator=gen)
    scales = torch.rand(rows, generator=gen).to(torch.bfloat16)
    fast = int8_dot.pack_int8_tiles(q, scales)
    monkeypatch.setattr(int8_dot, "_lib", lambda: None)
    through_torch = int8_dot.pack_int8_tiles(q, scales)
    assert torch.equal(fast.data, through_torch.data)
