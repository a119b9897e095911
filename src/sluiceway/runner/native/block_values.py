"""`q6_k_values`: GGUF Q6_K blocks as float32 in C, on every thread, bit for bit
the values gguf-py's `quants.dequantize` gives (see `block_values.c`)."""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from sluiceway.runner.native.library import bind

_ARGTYPES = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
Q6_K_BLOCK_BYTES = 210


def q6_k_values(data: np.ndarray, rows: int) -> torch.Tensor | None:
    """Rows of Q6_K blocks (`data` uint8, `[rows, bytes a row]`, each row whole
    blocks of 256 weights) as float32 `[rows, 256 * blocks a row]`; None where
    the kernel cannot be built (the caller then decodes with gguf-py)."""
    fn = bind("block_values", "block_values_q6_k", _ARGTYPES)
    if fn is None:
        return None
    data = np.ascontiguousarray(data, dtype=np.uint8)
    if data.size % Q6_K_BLOCK_BYTES:
        raise ValueError(f"{data.size} bytes are not whole Q6_K blocks")
    blocks = data.size // Q6_K_BLOCK_BYTES
    out = torch.empty((rows, blocks * 256 // rows), dtype=torch.float32)
    fn(data.ctypes.data, blocks, out.data_ptr(), torch.get_num_threads())
    return out
