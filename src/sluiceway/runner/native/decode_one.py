"""`OneTokenDecode`: a step of one sequence with one new token through every layer in
one C call (see `decode_one.c`), for bfloat16 or float32 models whose projections
are int4 or int8 in forms the native kernels take (a layer may mix them), with
native layer ops and native decode attention. It computes exactly what the Python layer loop
computes with those kernels."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from sluiceway.runner.linear import Int4Weight, Int8Weight, Linear
from sluiceway.runner.native import int8_dot
from sluiceway.runner.native.library import bind
from sluiceway.runner.native.paged_decode import native_decode_takes
from sluiceway.runner.native.quantized_matmul_f32 import quantized_matmul_f32_available
from sluiceway.runner.native.quantized_matvec import int8_matvec_available

if TYPE_CHECKING:
    from sluiceway.runner.attention import AttentionMetadata
    from sluiceway.runner.kv_cache import KVCache
    from sluiceway.runner.models.architecture import ModelShape
    from sluiceway.runner.models.layer import LayerWeights

_P, _I, _F, _N = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
_ARGTYPES = [_P, _P, _I] + [_I] * 5 + [_P, _P, _P, _I, _P, _I, _P, _I, _F, _F, _N, _N, _N]
# paged_decode.c's CACHE_ kinds of the caches the step takes: the model's dtype,
# or int8 / fp8 codes with their scales.
_CACHE_KINDS = {"bfloat16": 0, "float32": 1, "int8": 2, "fp8": 3}
TILED = 16  # decode_one.c's flag for int8_dot's tiles
_ERRORS = {
    1: "shapes the native kernels do not take",
    2: "out of memory",
    3: "a KV-cache slot outside the cache",
    4: "a context longer than its block table",
}


_SUFFIXES = {torch.bfloat16: "bf16", torch.float32: "f32"}


def _function(dtype: torch.dtype):
    return bind("decode_one", f"decode_one_{_SUFFIXES[dtype]}", _ARGTYPES, _N)


def _int8_kernel_takes(dtype: torch.dtype, in_features: int) -> bool:
    if dtype == torch.bfloat16:
        return int8_matvec_available(in_features)
    return in_features % 32 == 0 and quantized_matmul_f32_available()


def _projection(linear: Linear) -> tuple[int, torch.Tensor, torch.Tensor | None] | None:
    """`(bits, weight, int8 row scales or None)` of a projection the C step takes, in
    a bfloat16 or float32 model: int4 or int8 in `int8_dot`'s tiles (`bits` with
    TILED set and the tiles' scale format above its low byte), int4 with its
    dtype's native packing, or int8 with scales of its
    dtype over whole groups of 32 inputs; None for anything else."""
    quantized = linear.quantized
    if linear.dtype not in _SUFFIXES:
        return None
    tiled = getattr(quantized, "tiled", None)
    if tiled is not None:
        return tiled.bits | TILED | tiled.scale_format << 8, tiled.data, None
    if isinstance(quantized, Int4Weight) and quantized.native is not None:
        return 4, quantized.native, None
    if (
        isinstance(quantized, Int8Weight)
        and quantized.scales is not None
        and quantized.scales.dtype == linear.dtype
        and quantized.q is not None
        and quantized.q.is_contiguous()
        and _int8_kernel_takes(linear.dtype, linear.in_features)
    ):
        return 8, quantized.q, quantized.scales
    return None


def _kernels_take(shape: ModelShape) -> bool:
    """Whether the RoPE and decode-attention kernels take these heads (the limits
    in `layer_ops.c` and `paged_decode.c`)."""
    dim = shape.head_dim
    return dim % 2 == 0 and native_decode_takes(shape.num_heads, shape.num_kv_heads, dim)


def _ptr(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else tensor.data_ptr()


class OneTokenDecode:
    """Built once per model and KV cache; `run` serves steps of exactly one sequence
    with one new token."""

    def __init__(
        self,
        fn,
        shape: ModelShape,
        pointers: list[list[int]],
        intermediate: int,
        kv_cache: KVCache,
    ):
        """Use `build`: it checks what the C step takes and lays out `pointers`."""
        self._fn = fn
        self._shape = shape
        self._intermediate = intermediate
        # Pointers into tensors the model and the cache hold for their lifetime.
        self._layers = torch.tensor(pointers, dtype=torch.int64)
        self._num_slots = kv_cache.num_blocks * kv_cache.block_size
        self._block_size = kv_cache.block_size
        self._kv_cache = kv_cache
        self._cache_kind = _CACHE_KINDS[kv_cache.format.name]

    @classmethod
    def build(
        cls, shape: ModelShape, layers: Sequence[LayerWeights], kv_cache: KVCache, eligible: bool
    ) -> OneTokenDecode | None:
        """The fused step for this model and cache, or None unless the kernels take its
        heads, every projection is int4 or int8 in a form the kernels take (see
        `_projection`), the norms, biases and caches are contiguous CPU tensors
        of one dtype (bfloat16 or float32), the caches hold that dtype or int8 /
        fp8 codes (`--kv-cache-dtype`), the model's other kernels are the native
        ones (`eligible`) and the library builds here."""
        cache_format = kv_cache.format
        plain = kv_cache.stores_compute_dtype
        if (
            not eligible
            or not layers
            or not _kernels_take(shape)
            # plain rows of the model's dtype, or codes with their scales
            or not (plain or cache_format.quantized)
        ):
            return None
        tensors: list[torch.Tensor] = []
        pointers = []  # one row per layer, in decode_one.c's order
        for i, layer in enumerate(layers):
            row = [_ptr(layer.input_norm), _ptr(layer.post_norm)]
            tensors += [layer.input_norm, layer.post_norm]
            for linear in (layer.qkv, layer.o, layer.gate_up, layer.down):
                # A layer of experts has no single gate_up and down: not this step's.
                projection = None if linear is None else _projection(linear)
                if linear is None or projection is None:
                    return None
                bits, weight, scales = projection
                row += [_ptr(weight), _ptr(scales), _ptr(linear.bias), bits]
                if linear.bias is not None:
                    tensors.append(linear.bias)
            caches = [kv_cache.key_caches[i], kv_cache.value_caches[i]]
            cache_scales = [
                None if kv_cache.key_scales is None else kv_cache.key_scales[i],
                None if kv_cache.value_scales is None else kv_cache.value_scales[i],
            ]
            row += [_ptr(cache) for cache in caches] + [_ptr(t) for t in cache_scales]
            if plain:
                tensors += caches
            elif not all(
                t is not None and t.device.type == "cpu" and t.is_contiguous()
                for t in [*caches, *cache_scales]
            ):
                return None
            pointers.append(row)
        dtype = tensors[0].dtype
        if (
            dtype not in _SUFFIXES
            or not all(
                t.dtype == dtype and t.device.type == "cpu" and t.is_contiguous()
                for t in tensors
            )
            or any(layer.qkv.dtype != dtype for layer in layers)
            or cache_format.compute != dtype
        ):
            return None
        fn = _function(dtype)
        if fn is None:
            return None
        down = layers[0].down
        assert down is not None  # every layer's projections were checked above
        intermediate = down.in_features
        return cls(fn, shape, pointers, intermediate, kv_cache)

    def serves(self, kv_cache: KVCache, meta: AttentionMetadata) -> bool:
        """Whether `run` takes this step: one sequence, one new token, this cache."""
        return (
            kv_cache is self._kv_cache
            and meta.query_lens_host == (1,)
            and meta.block_tables.dtype == torch.int32
            and meta.block_tables.is_contiguous()
            and meta.seq_lens.dtype == torch.int32
            and meta.slot_mapping.dtype == torch.int64
        )

    def run(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        signed_sin: torch.Tensor,
        meta: AttentionMetadata,
        eps: float,
    ) -> torch.Tensor:
        """Every layer for `hidden` (`[1, hidden_size]`, the token's embedding, updated
        in place): returns it as the residual stream after the last layer, before the
        final norm; this token's k/v are in the cache. Raises RuntimeError for what
        the kernels refuse. Runs to completion once called and releases the GIL."""
        s = self._shape
        status = self._fn(
            hidden.data_ptr(),
            self._layers.data_ptr(),
            s.num_layers,
            s.hidden_size,
            s.num_heads,
            s.num_kv_heads,
            s.head_dim,
            self._intermediate,
            cos.data_ptr(),
            signed_sin.data_ptr(),
            meta.slot_mapping.data_ptr(),
            self._num_slots,
            meta.block_tables.data_ptr(),
            meta.block_tables.shape[1],
            meta.seq_lens.data_ptr(),
            self._block_size,
            meta.scale,
            eps,
            torch.get_num_threads(),
            int8_dot.level(),
            self._cache_kind,
        )
        if status:
            raise RuntimeError(f"the one-token decode step failed: {_ERRORS.get(status, status)}")
        return hidden
