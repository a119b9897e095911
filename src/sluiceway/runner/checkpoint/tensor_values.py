"""A stored GGUF tensor's values in a torch dtype, a few rows at a time.

Float tensors are converted as stored; Q4_0/Q4_1/Q4_K/Q8_0 are decoded with
torch (`block_codes`; Q4_K bit for bit as gguf-py decodes it, many times
faster), Q6_K in C (`native.block_values`, bit for bit too, a Q4_K_M's head and
half its attn_v and ffn_down); every other block type with
`gguf.quants.dequantize`, in chunks of rows, so a tensor is never held in
float32 whole beside its result.
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants

from sluiceway.runner.checkpoint.block_codes import (
    INT4_BLOCK_TYPES,
    int4_blocks,
    q4_k_values,
    q8_0_values,
)
from sluiceway.runner.checkpoint.errors import CheckpointError
from sluiceway.runner.checkpoint.gguf_file import StoredTensor
from sluiceway.runner.native.block_values import q6_k_values

# Elements dequantized per chunk: 16 MB of float32.
_CHUNK_ELEMENTS = 1 << 22
_FLOATS = {
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64,
}


def stored_rows(tensor: StoredTensor) -> int:
    """Rows of `tensor` seen as a matrix of its last dimension."""
    return tensor.n_elements // tensor.shape[-1]


def read_rows(
    tensor: StoredTensor,
    dtype: torch.dtype,
    start: int = 0,
    stop: int | None = None,
) -> torch.Tensor:
    """Rows `start:stop` of `tensor` (as a matrix of its last dimension) in `dtype`,
    `[rows, cols]`. `CheckpointError` for a type no decoder here knows."""
    total = stored_rows(tensor)
    stop = total if stop is None else stop
    cols = tensor.shape[-1]
    blocks = tensor.blocks()
    out = torch.empty((stop - start, cols), dtype=dtype)
    step = max(1, _CHUNK_ELEMENTS // cols)
    for first in range(start, stop, step):
        last = min(stop, first + step)
        out[first - start : last - start] = _decode(tensor, blocks[first:last], last - first)
    return out


def _decode(
    tensor: StoredTensor,
    data: np.ndarray,
    rows: int,
) -> torch.Tensor:
    kind = tensor.ggml_type
    if kind in _FLOATS:
        return torch.from_numpy(np.array(data).view(_FLOATS[kind]).reshape(rows, -1))
    if kind == GGMLQuantizationType.BF16:
        return torch.from_numpy(np.array(data).view(np.int16).reshape(rows, -1)).view(torch.bfloat16)
    if kind == GGMLQuantizationType.Q4_K:
        return q4_k_values(data, rows)
    if kind in INT4_BLOCK_TYPES:
        blocks = int4_blocks(kind, data, rows)
        return blocks.values()
    if kind == GGMLQuantizationType.Q8_0:
        return q8_0_values(data, rows)
    if kind == GGMLQuantizationType.Q6_K:
        decoded = q6_k_values(data, rows)
        if decoded is not None:
            return decoded
    try:
        values = quants.dequantize(data, kind)
    except NotImplementedError:
        raise CheckpointError(
            f"tensor {tensor.name}: type {kind.name} cannot be dequantized here"
        ) from None
    return torch.from_numpy(values.reshape(rows, -1))
