"""`int4_matmul_f32` and `int8_matmul_f32`: weight-only quantized products of float32
rows (decode at small batches), in C with AVX2 and FMA (see `quantized_matmul_f32.c`
for the layout and why). The float32 counterpart of
`quantized_matvec`, for CPUs without AVX512-BF16. Each returns None for what it
does not take, and the caller uses another path."""

from __future__ import annotations

import ctypes
import functools

import torch

from sluiceway.runner.native.library import load_kernels
from sluiceway.runner.native.quantized_matvec import pack_int4

_P, _I, _N = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


@functools.cache
def _lib():
    """The library, or None without a build that has AVX2 and FMA."""
    return load_kernels(
        "quantized_matmul_f32",
        "quantized_matmul_f32_available",
        {
            "int4_matmul_f32": ([_P, _I, _I, _P, _I, _P, _N], _N),
            "int8_matmul_f32": ([_P, _I, _I, _P, _P, _I, _P, _N], _N),
        },
    )


def quantized_matmul_f32_available() -> bool:
    """Whether the kernels run here: built with AVX2 and FMA (compiled on first call)."""
    return _lib() is not None


def _takes_rows(x: torch.Tensor) -> bool:
    """Contiguous float32 CPU rows, at least one: what both kernels take."""
    return (
        x.dtype is torch.float32
        and x.is_cpu
        and x.dim() == 2
        and x.shape[0] >= 1
        and x.is_contiguous()
    )


def pack_int4_f32(q: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The int4 kernel's layout of the weight `(q - 8) * scales + offsets` (`q`
    integers 0..15 `[out, in]`, `in` a multiple of 64; float32 `scales` and `offsets`
    `[out, in / 32]`): nibbles, then float32 scales and biases `offsets - 8 * scales`,
    so the kernel computes `q * scale + bias`."""
    scales = scales.to(torch.float32)
    return pack_int4(q, scales, offsets.to(torch.float32) - 8.0 * scales, torch.float32)


def int4_matmul_f32(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor | None:
    """`x [m, in]` (contiguous float32 rows on the CPU) times the transposed weight
    that `packed` holds (from `pack_int4_f32`): `[m, out]` float32.
    None when the kernel does not take these tensors. Runs to completion once called
    and releases the GIL."""
    lib = _lib()
    if lib is None or not _takes_rows(x):
        return None
    m, in_features = x.shape
    out_features, row_bytes = packed.shape
    if row_bytes != in_features // 2 + 8 * (in_features // 32):
        raise ValueError("x and the packed weight disagree in input features")
    y = torch.empty((m, out_features), dtype=torch.float32)
    status = lib.int4_matmul_f32(
        x.data_ptr(), m, in_features, packed.data_ptr(), out_features, y.data_ptr(),
        torch.get_num_threads(),
    )  # fmt: skip
    if status == 2:
        raise MemoryError("int4_matmul_f32 could not allocate its scratch memory")
    return None if status else y


def int8_matmul_f32(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor | None:
    """`x [m, in]` (contiguous float32 rows on the CPU) times the transposed weight
    `q * scales[:, None]` (`q` contiguous int8 `[out, in]`, `in` a
    multiple of 32; `scales` float32 `[out]`): `[m, out]` float32. None when the
    kernel does not take these tensors. Runs to completion once called and releases
    the GIL."""
    lib = _lib()
    if (
        lib is None
        or not _takes_rows(x)
        or q.dtype is not torch.int8
        or scales.dtype is not torch.float32
        or not (q.is_contiguous() and scales.is_contiguous())
        or q.shape[1] % 32
    ):
        return None
    out_features, in_features = q.shape
    if x.shape[1] != in_features or scales.shape != (out_features,):
        raise ValueError("x, the int8 weight and its scales disagree in shape")
    y = torch.empty((x.shape[0], out_features), dtype=torch.float32)
    status = lib.int8_matmul_f32(
        x.data_ptr(), x.shape[0], in_features, q.data_ptr(), scales.data_ptr(), out_features,
        y.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    return None if status else y
