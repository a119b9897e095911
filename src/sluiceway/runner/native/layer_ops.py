"""The elementwise ops of a decoder layer (RMSNorm, residual add + RMSNorm,
SiLU-and-multiply, RoPE with the KV-cache store): `TorchLayerOps` in torch,
`NativeLayerOps` in C on the CPU, where each is one pass instead of several ops and
temporaries (at batch 1 most of an op's time in torch is the calls themselves;
float32's exact RMSNorm takes eight torch ops).

Both promise the same results up to rounding; `TorchLayerOps` is the exact
reference (float32 stays bit-for-bit what transformers computes), so float32 takes
the native ops only where that parity is not promised anyway: quantized models.
"""

from __future__ import annotations

import ctypes
from typing import Protocol

import torch
import torch.nn.functional as F

from sluiceway.runner.native.library import load_library


class LayerOps(Protocol):
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """`x [T, dim]` normalised by its root mean square, times `weight`."""
        ...

    def add_rms_norm(
        self, residual: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`(residual + delta, rms_norm(residual + delta))`. May update `residual`
        in place: callers pass a residual stream nobody else holds."""
        ...

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """`silu(gate) * up` for `gate_up = [gate | up]` (`[T, 2 * n]` -> `[T, n]`)."""
        ...

    def rope_and_cache(
        self,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        signed_sin: torch.Tensor,
        num_heads: int,
        slots: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """RoPE of the q and k heads of `qkv` (`[T, (H + 2 * KVH) * D]`, rows of q, k
        and v heads; `cos`, `signed_sin` `[T, 1, D]` as `apply_rope` takes them) AND
        the rotated k and the v stored at `slots` (`[T]` int64) of one layer's caches
        (`[num_blocks, block_size, KVH, D]`). Returns `(q [T, H, D], k, v [T, KVH, D])`
        with the same values as `apply_rope` gives; `qkv` may be overwritten (callers
        pass a projection output nobody else holds).

        None when there is no fused op for these tensors: the caller then rotates
        with `apply_rope` and the attention backend stores k and v."""
        ...


def torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype != torch.float32:
        # One fused op instead of eight. It rounds once where transformers rounds
        # the normalised value to x.dtype before the weight multiply, so half
        # precision differs from transformers in the last bit (nothing asserts
        # half-precision parity; float32 below stays exact).
        return F.rms_norm(x, weight.shape, weight, eps)
    # Same op order as transformers' LlamaRMSNorm, so float32 results agree bit for bit.
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


class TorchLayerOps:
    """The reference implementation, in torch ops."""

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return torch_rms_norm(x, weight, eps)

    def add_rms_norm(
        self, residual: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = residual + delta
        return hidden, torch_rms_norm(hidden, weight, eps)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def rope_and_cache(
        self,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        signed_sin: torch.Tensor,
        num_heads: int,
        slots: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        # Separate ops: the attention backend's own store (index_copy_ on the CPU, a
        # triton kernel on the GPU) is as good as anything torch could fuse here.
        return None


_P, _I, _F, _N = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int


_SUFFIXES = {torch.bfloat16: "bf16", torch.float32: "f32"}


class NativeLayerOps:
    """The C kernels in `layer_ops.c`, for contiguous CPU tensors of `dtype` (bfloat16
    or float32; anything else goes to `TorchLayerOps`). Calls release the GIL and run
    to completion."""

    def __init__(self, lib: ctypes.CDLL, dtype: torch.dtype = torch.bfloat16) -> None:
        suffix = _SUFFIXES[dtype]
        self.dtype = dtype
        self._rms = getattr(lib, f"rms_norm_{suffix}")
        self._rms.argtypes, self._rms.restype = [_P, _P, _P, _I, _I, _F, _N], None
        self._add_rms = getattr(lib, f"add_rms_norm_{suffix}")
        self._add_rms.argtypes, self._add_rms.restype = [_P, _P, _P, _P, _I, _I, _F, _N], None
        self._silu_mul = getattr(lib, f"silu_mul_{suffix}")
        self._silu_mul.argtypes, self._silu_mul.restype = [_P, _P, _I, _I, _N], None
        self._rope_cache = getattr(lib, f"rope_cache_{suffix}")
        self._rope_cache.argtypes = [_P] * 7 + [_I] * 5 + [_N]
        self._rope_cache.restype = _N
        self._fallback = TorchLayerOps()

    def _takes(self, *tensors: torch.Tensor) -> bool:
        # A plain loop and `is_cpu`: this runs three times per layer per step, and
        # a generator with `device.type` cost several times as much.
        dtype = self.dtype
        for t in tensors:
            if t.dtype is not dtype or not t.is_cpu or not t.is_contiguous():
                return False
        return True

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if not (self._takes(x, weight) and x.dim() == 2 and weight.shape == x.shape[1:]):
            return self._fallback.rms_norm(x, weight, eps)
        out = torch.empty_like(x)
        rows, dim = x.shape
        self._rms(
            x.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, dim, eps, torch.get_num_threads()
        )
        return out

    def add_rms_norm(
        self, residual: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not (
            self._takes(residual, delta, weight)
            and residual.dim() == 2
            and delta.shape == residual.shape
            and weight.shape == residual.shape[1:]
        ):
            return self._fallback.add_rms_norm(residual, delta, weight, eps)
        out = torch.empty_like(residual)
        rows, dim = residual.shape
        self._add_rms(
            residual.data_ptr(),
            delta.data_ptr(),
            weight.data_ptr(),
            out.data_ptr(),
            rows,
            dim,
            eps,
            torch.get_num_threads(),
        )
        return residual, out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if not (self._takes(gate_up) and gate_up.dim() == 2 and gate_up.shape[1] % 2 == 0):
            return self._fallback.silu_mul(gate_up)
        rows, width = gate_up.shape
        out = torch.empty((rows, width // 2), dtype=gate_up.dtype)
        self._silu_mul(
            gate_up.data_ptr(), out.data_ptr(), rows, width // 2, torch.get_num_threads()
        )
        return out

    def rope_and_cache(
        self,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        signed_sin: torch.Tensor,
        num_heads: int,
        slots: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        # One pass instead of eight torch ops and two index_copy_ calls; at batch 1
        # most of the torch path's time is the calls.
        if not (
            self._takes(qkv, cos, signed_sin, key_cache, value_cache)
            and slots.dtype is torch.int64
            and slots.is_contiguous()
            and key_cache.dim() == 4
            and value_cache.shape == key_cache.shape
        ):
            return None
        rows, width = qkv.shape
        _, block_size, num_kv_heads, head_dim = key_cache.shape
        if width != (num_heads + 2 * num_kv_heads) * head_dim or slots.shape != (rows,):
            raise ValueError("qkv, slots and the caches disagree in shape")
        if cos.shape != (rows, 1, head_dim) or signed_sin.shape != cos.shape:
            raise ValueError("the RoPE tables need one row of head_dim per token")
        q = torch.empty((rows, num_heads, head_dim), dtype=qkv.dtype)
        status = self._rope_cache(
            qkv.data_ptr(),
            cos.data_ptr(),
            signed_sin.data_ptr(),
            slots.data_ptr(),
            q.data_ptr(),
            key_cache.data_ptr(),
            value_cache.data_ptr(),
            rows,
            num_heads,
            num_kv_heads,
            head_dim,
            key_cache.shape[0] * block_size,
            torch.get_num_threads(),
        )
        if status == 1:
            return None  # a head_dim the kernel does not take: the torch path serves it
        if status == 2:
            raise IndexError("a KV-cache slot is outside the cache")
        kv = qkv[:, num_heads * head_dim :].view(rows, 2 * num_kv_heads, head_dim)
        return q, kv[:, :num_kv_heads], kv[:, num_kv_heads:]


def layer_ops_for(
    dtype: torch.dtype,
    device: torch.device,
    native: bool | None = None,
    *,
    exact_float32: bool = True,
) -> LayerOps:
    """`NativeLayerOps` on the CPU where the kernels build, for bfloat16, and for
    float32 unless `exact_float32` (which keeps float32 bit-for-bit what transformers
    computes); else `TorchLayerOps`. `native` None: where available; False: never;
    True: required, ValueError otherwise."""
    wanted = (
        native is not False
        and device.type == "cpu"
        and (dtype == torch.bfloat16 or (dtype == torch.float32 and not exact_float32))
    )
    lib = load_library("layer_ops") if wanted else None
    if native and lib is None:
        raise ValueError(
            "native layer ops need a CPU with the kernels built, and bfloat16 (or float32 "
            "where exact parity is not asked for)"
        )
    return TorchLayerOps() if lib is None else NativeLayerOps(lib, dtype)
