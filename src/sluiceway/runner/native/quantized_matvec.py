"""`int4_matvec` and `int8_matvec`: weight-only quantized products of one bfloat16
row (decode at batch 1), in C with AVX512-BF16 (see `quantized_matvec.c` for the
layouts and the measurements). `Int4Weight` also packs its weight for the int4
kernel where it is available; the int8 kernel reads `Int8Weight`'s own matrix.
torch's kernels serve every other call."""

from __future__ import annotations

import ctypes
import functools

import torch

from sluiceway.runner.native.library import load_kernels

_P, _I, _N = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


@functools.cache
def _lib():
    """The library, or None without a build that has AVX512-BF16."""
    return load_kernels(
        "quantized_matvec",
        "quantized_matvec_available",
        {
            "int4_matvec_bf16": ([_P, _I, _P, _I, _P, _N], _N),
            "int8_matvec_bf16": ([_P, _I, _P, _P, _I, _P, _N], _N),
        },
    )


def _takes_row(x: torch.Tensor) -> bool:
    """One contiguous bfloat16 CPU row: what both kernels take."""
    return (
        x.dtype is torch.bfloat16
        and x.is_cpu
        and x.dim() == 2
        and x.shape[0] == 1
        and x.is_contiguous()
    )


def int4_matvec_available(in_features: int) -> bool:
    """Whether the kernel serves weights with `in_features` inputs here: built with
    AVX512-BF16 (compiled on first call) and `in_features` a multiple of 64."""
    return in_features % 64 == 0 and _lib() is not None


def int8_matvec_available(in_features: int) -> bool:
    """Whether `int8_matvec` serves weights with `in_features` inputs here: built with
    AVX512-BF16 (compiled on first call) and `in_features` a multiple of 32."""
    return in_features % 32 == 0 and _lib() is not None


def pack_int4(
    q: torch.Tensor,
    scales: torch.Tensor,
    offsets: torch.Tensor,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """The kernel's layout, `uint8 [out, in / 2 + 2 * dtype size * (in / 32)]`: `q`
    integers 0..15 `[out, in]` as nibbles, then each row's `scales` and `offsets`
    `[out, in / 32]` stored in `dtype`. This kernel reads bfloat16 ones as the weight
    `(q - 8) * scales + offsets`; `quantized_matmul_f32` reads float32 ones as
    `q * scales + offsets`."""
    out_features, in_features = q.shape
    if in_features % 64:
        raise ValueError(f"int4_matvec needs input features divisible by 64, not {in_features}")
    nibbles = q.to(torch.uint8).view(out_features, -1, 2, 32)  # [out, in / 64, half, 32]
    packed = nibbles[:, :, 0] | (nibbles[:, :, 1] << 4)
    tail = torch.cat([scales, offsets], dim=1).to(dtype).view(torch.uint8)
    return torch.cat([packed.reshape(out_features, -1), tail], dim=1).contiguous()


def int4_matvec(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor | None:
    """`x [1, in]` (contiguous bfloat16 on the CPU) times the transposed weight that
    `packed` holds (from `pack_int4`): `[1, out]` bfloat16. None when the kernel does
    not take these tensors; the caller then uses another path. Runs to completion
    once called and releases the GIL."""
    lib = _lib()
    if lib is None or not _takes_row(x):
        return None
    in_features = x.shape[1]
    out_features, row_bytes = packed.shape
    if row_bytes != in_features // 2 + 4 * (in_features // 32):
        raise ValueError("x and the packed weight disagree in input features")
    y = torch.empty((1, out_features), dtype=torch.bfloat16)
    status = lib.int4_matvec_bf16(
        x.data_ptr(), in_features, packed.data_ptr(), out_features, y.data_ptr(), torch.get_num_threads()
    )
    if status == 2:
        raise MemoryError("int4_matvec could not allocate its scratch memory")
    return None if status else y


def int8_matvec(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor | None:
    """`x [1, in]` (contiguous bfloat16 on the CPU) times the transposed weight
    `q * scales[:, None]` (`q` contiguous int8 `[out, in]`, `scales` bfloat16 `[out]`,
    `in` a multiple of 32): `[1, out]` bfloat16. None when the kernel does not take
    these tensors. Runs to completion once called and releases the GIL."""
    lib = _lib()
    if (
        lib is None
        or not _takes_row(x)
        or q.dtype is not torch.int8
        or scales.dtype is not torch.bfloat16
        or not (q.is_contiguous() and scales.is_contiguous())
    ):
        return None
    out_features, in_features = q.shape
    if x.shape[1] != in_features or scales.shape != (out_features,):
        raise ValueError("x, the int8 weight and its scales disagree in shape")
    y = torch.empty((1, out_features), dtype=torch.bfloat16)
    status = lib.int8_matvec_bf16(
        x.data_ptr(),
        in_features,
        q.data_ptr(),
        scales.data_ptr(),
        out_features,
        y.data_ptr(),
        torch.get_num_threads(),
    )
    return None if status else y
