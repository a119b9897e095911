"""Layers served on int4 from a GGUF's own 4-bit blocks.

The runtime int4 format has Q4_0's and Q4_1's groups of 32, and Q4_K's
sub-blocks are groups of 32 too (`block_codes`), so a layer linear stored in
those types keeps the stored codes and scales: the runner builds it straight
from its blocks (`StoredBlocks`, which the layer builder asks first), packed into
the int4 kernels' layout one linear at a time, never as float values and never
quantized again. The others (a Q4_K_M's Q6_K layers) are read as values and
quantized as their stored bits say. In float32 the served weights are the
stored ones bit for bit (up to the rounding of an offset that sums two terms);
in bfloat16 the scales and offsets are rounded to bfloat16 as every int4
scale is, and the codes stay, except for linears stored all in Q4_0, which keep
its float16 scales and no offsets in either dtype: the file's values and bytes.
The output head is int8, quantized from its
values, as on the int4 path everywhere (`models.decoder`), unless it is stored
in 4-bit blocks itself.

On the int8 path, linears stored in Q8_0 keep its blocks the same way, where the
int8-activation kernels serve the model's dtype: the tiles hold each block's
codes and float16 d (`int8_dot.pack_int8_block_tiles`), the stored weights
exactly, 34 bytes a row and block as in the file, where the per-row int8
format would requantize them.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType

from sluiceway.runner.checkpoint.block_codes import INT4_BLOCK_TYPES, Int4Blocks
from sluiceway.runner.linear import (
    INT4_GROUP_SIZE,
    Int4Weight,
    Int8Weight,
)
from sluiceway.runner.models.registry import family_for
from sluiceway.runner.models.weights import WeightView
from sluiceway.runner.native import int8_dot as int8_dot_kernel
from sluiceway.runner.native.int8_dot import (
    TiledWeight,
    pack_int4_nibble_tiles,
    pack_int8_block_tiles,
)
from sluiceway.runner.native.quantized_matmul_f32 import (
    pack_int4_f32,
    quantized_matmul_f32_available,
)
from sluiceway.runner.native.quantized_matvec import int4_matvec_available, pack_int4

Q4_0 = GGMLQuantizationType.Q4_0
Q8_0 = GGMLQuantizationType.Q8_0
_INT4_TYPES = frozenset(t.name for t in INT4_BLOCK_TYPES)
# The stored types each weight-only path takes as they are.
STORED_BLOCK_TYPES = {"int4": _INT4_TYPES, "int8": frozenset({Q8_0.name})}

_LINEAR_PARTS = {"qkv": ("q", "k", "v"), "o": ("o",), "gate_up": ("gate", "up"), "down": ("down",)}


def _linear_views(
    config, weights
) -> Iterator[tuple[str, tuple[int, ...], list[WeightView | None]]]:
    """(slot, path, views of its parts) for every layer linear the model has:
    slot one of `_LINEAR_PARTS` or "experts.gate_up"/"experts.down"; path the
    layer index, and the expert's where it is one."""
    views = family_for(config).weight_views(config, weights)
    for i in range(config.num_hidden_layers):
        p = f"layers.{i}."
        for slot, parts in _LINEAR_PARTS.items():
            found = [views.get(f"{p}{n}.weight") for n in parts]
            if any(v is not None for v in found):
                yield slot, (i,), found
        e = 0
        while f"{p}experts.{e}.down" in views:
            yield "gate_up", (i, e), [views.get(f"{p}experts.{e}.{n}") for n in ("gate", "up")]
            yield "down", (i, e), [views.get(f"{p}experts.{e}.down")]
            e += 1


def servable_from_blocks(
    config, weights, quantization: str = "int4", dtype: torch.dtype | None = None
) -> bool:
    """Whether some layer linear of the checkpoint is stored in the block types
    `quantization` takes as stored (`STORED_BLOCK_TYPES`: Q4_0, Q4_1, Q4_K for
    int4; Q8_0 for int8, where the int8 tiles serve `dtype`), every part of it,
    with shapes the formats take (input a multiple of 32, output of 16): then
    `StoredBlocks` serves those."""
    names = STORED_BLOCK_TYPES.get(quantization or "", frozenset())
    if quantization == "int8" and (dtype is None or not int8_blocks_served(dtype)):
        return False
    for _slot, _path, views in _linear_views(config, weights):
        if any(v is None for v in views):
            continue
        rows, stored = 0, True
        for view in views:
            assert view is not None
            tensor = weights[view.name]
            stored &= getattr(tensor, "type_name", None) in names
            stored &= not tensor.shape[-1] % INT4_GROUP_SIZE
            rows += (view.rows[1] - view.rows[0]) if view.rows else tensor.shape[-2]
        if stored and not rows % 16:
            return True
    return False


def _index(view: WeightView) -> tuple[Any, ...]:
    index: tuple[Any, ...] = ()
    if view.expert is not None:
        index += (view.expert,)
    return (*index, slice(*view.rows) if view.rows else slice(None))


def _blocks(weights, view: WeightView) -> Int4Blocks:
    return weights[view.name].int4_blocks(_index(view))


def int4_weight(blocks: Int4Blocks, dtype: torch.dtype) -> Int4Weight:
    """`blocks` in the runtime int4 layouts of `dtype` where it is not packed into
    the int8-activation kernels' tiles (`StoredBlocks` packs those), as
    `Int4Weight.quantize` would pack the same codes, scales and offsets: the
    native kernel's layout where one serves `dtype`, and torch's packing where no
    native kernel serves every call."""
    cols = blocks.shape[1]
    scale = blocks.scales.to(dtype).float()
    offset = blocks.offsets.to(dtype).float()
    codes = blocks.codes
    native = None
    if cols % 64 == 0:
        if dtype == torch.bfloat16 and int4_matvec_available(cols):
            native = pack_int4(codes, scale, offset)
        elif dtype == torch.float32 and quantized_matmul_f32_available():
            native = pack_int4_f32(codes, scale, offset)
    sz = torch.stack([scale, offset], dim=-1)  # [rows, groups, 2]
    every_call_native = native is not None and dtype == torch.float32
    return Int4Weight(
        packed=None
        if every_call_native
        else torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1),
        scales_and_offsets=sz.transpose(0, 1).contiguous().to(dtype),
        group_size=INT4_GROUP_SIZE,
        native=native,
    )


@functools.cache
def _tiles_packed(dtype: torch.dtype) -> bool:
    """Whether `Int4Weight.quantize` packs a weight of `dtype` for the
    int8-activation kernels here (asked of a 16x64 weight once)."""
    return Int4Weight.quantize(torch.ones(16, 64, dtype=dtype))[0].tiled is not None


@functools.cache
def int8_blocks_served(dtype: torch.dtype) -> bool:
    """Whether Q8_0 blocks are served as stored in a model of `dtype` here: where
    `Int8Weight` packs its weights for the int8-activation kernels."""
    return Int8Weight.quantize(torch.ones(16, 64, dtype=dtype))[0].tiled is not None


class StoredBlocks:
    """The layer linears a checkpoint stores in blocks a weight-only path takes
    as they are (Q4_0/Q4_1/Q4_K on int4, Q8_0 on int8), as weights of `dtype`
    packed from their blocks: called with a linear's canonical part names
    (`models.layer`'s, e.g. `layers.0.q.weight`, `layers.0.experts.3.down`) and
    the path, the fused parts' weight, or None where a part is not stored in
    that path's blocks. Path None takes either (the output head)."""

    def __init__(self, config, weights, dtype: torch.dtype) -> None:
        self._views = family_for(config).weight_views(config, weights)
        self._weights = weights
        self._dtype = dtype

    def __call__(
        self, names: list[str], quantization: str | None = "int4"
    ) -> Int4Weight | Int8Weight | None:
        if quantization in ("int8", None):
            int8 = self._int8_blocks(names)
            if int8 is not None or quantization == "int8":
                return int8
        views = self._stored_views(names, _INT4_TYPES)
        if views is None:
            return None
        if _tiles_packed(self._dtype):
            return Int4Weight(
                packed=None,
                scales_and_offsets=None,
                group_size=INT4_GROUP_SIZE,
                tiled=self._tiles(views),
            )
        return int4_weight(
            Int4Blocks.stacked([_blocks(self._weights, v) for v in views]), self._dtype
        )

    def rows(self, name: str) -> TiledWeight | None:
        """Weight `name` (the embedding) in `int8_dot`'s tiles, for reading rows
        back (`int8_dot.unpack_rows`) rather than for products: packed whatever
        kernels serve `dtype`, as `_tiles` packs them. None where it is not stored
        in 4-bit blocks."""
        views = self._stored_views([name], _INT4_TYPES)
        if views is not None:
            return self._tiles(views)
        views = self._stored_views([name], STORED_BLOCK_TYPES["int8"])
        return None if views is None else self._int8_tiles(views)

    def _int8_blocks(self, names: list[str]) -> Int8Weight | None:
        """The Q8_0 linear `names` in block tiles, where every part is Q8_0 and the
        tiles serve this dtype; None otherwise."""
        if not int8_blocks_served(self._dtype):
            return None
        views = self._stored_views(names, STORED_BLOCK_TYPES["int8"])
        return (
            None
            if views is None
            else Int8Weight(q=None, scales=None, tiled=self._int8_tiles(views))
        )

    def _int8_tiles(self, views: list[WeightView]) -> TiledWeight:
        parts = [self._weights[v.name].q8_0_blocks(_index(v)) for v in views]
        return pack_int8_block_tiles(
            torch.cat([c for c, _ in parts]), torch.cat([d for _, d in parts])
        )

    def _tiles(self, views: list[WeightView]) -> TiledWeight:
        """The tiles of the stacked views, read from the mapped file in one pass
        where the kernel library is here (`int8_dot.pack_q4_rows`), else through
        the blocks' codes. Rows all in Q4_0 keep its float16 scales and no offsets
        (`SCALES_F16`): the stored weights exactly, in the file's bytes. Others get
        a scale and an offset per group in the model's dtype (float32 for
        float32 models, exact; bfloat16 rounds a K-quant's scales)."""
        as_stored = all(self._weights[v.name].type_name == Q4_0.name for v in views)
        if as_stored:
            scale_dtype = torch.float16
        else:
            scale_dtype = torch.bfloat16 if self._dtype == torch.bfloat16 else torch.float32
        if not int8_dot_kernel.available():
            blocks = Int4Blocks.stacked([_blocks(self._weights, v) for v in views])
            return pack_int4_nibble_tiles(
                blocks.nibbles,
                blocks.scales.to(scale_dtype).float(),
                None if as_stored else blocks.offsets.to(scale_dtype).float(),
                scale_dtype,
            )
        located = [self._weights[v.name].int4_rows(_index(v)) for v in views]
        addresses = np.concatenate([a for a, _ in located])
        kinds = np.concatenate([k for _, k in located])
        cols = self._weights[views[0].name].shape[-1]
        tiled = int8_dot_kernel.pack_q4_rows(addresses, kinds, cols, scale_dtype)
        for view in views:
            self._weights[view.name].read(_index(view))
        return tiled

    def _stored_views(self, names: list[str], types: frozenset[str]) -> list[WeightView] | None:
        """The views of `names` where every one is stored in blocks of `types`
        (whole groups of 32), with a multiple of 16 rows in all; None otherwise."""
        views, rows = [], 0
        for name in names:
            view = self._views.get(name)
            if view is None:
                return None
            tensor = self._weights[view.name]
            if getattr(tensor, "type_name", None) not in types:
                return None
            if tensor.shape[-1] % INT4_GROUP_SIZE:
                return None
            views.append(view)
            rows += (view.rows[1] - view.rows[0]) if view.rows else tensor.shape[-2]
        return None if rows % 16 else views
