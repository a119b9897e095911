"""Q6_K blocks decoded in C (`native/block_values.c`): bit for bit what gguf-py's
decoder gives, for random blocks whose float16 scales span normal, subnormal,
zero and negative values."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from sluiceway.runner.native.block_values import q6_k_values

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


def _blocks(rows: int, per_row: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (rows, per_row * 210), dtype=np.uint8)
    d = (rng.standard_normal((rows, per_row)) * np.logspace(-9, 0, per_row)).astype(np.float16)
    d[0, 0] = 0.0
    d[-1, -1] = -np.float16(6e-8)  # a subnormal float16
    data.reshape(rows, per_row, 210)[..., 208:] = d.view(np.uint8).reshape(rows, per_row, 2)
    return data


@pytest.mark.parametrize(("rows", "per_row"), [(1, 1), (3, 4), (70, 2)])
def test_q6_k_values_are_gguf_pys(rows, per_row):
    data = _blocks(rows, per_row, seed=rows)
    want = quants.dequantize(data, GGMLQuantizationType.Q6_K).reshape(rows, -1)
    got = q6_k_values(data, rows)
    assert got is not None and got.shape == (rows, 256 * per_row)
    assert torch.equal(got, torch.from_numpy(want))
    assert got.abs().max() > 0


def test_partial_blocks_are_refused():
    with pytest.raises(ValueError, match="not whole Q6_K blocks"):
        q6_k_values(np.zeros((1, 200), dtype=np.uint8), 1)
