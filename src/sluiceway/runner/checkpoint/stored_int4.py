"""Layers served on int4 from a GGUF's own 4-bit blocks.

The runtime int4 format has Q4_0's and Q4_1's groups of 32 (`block_codes`), so
a model whose layers are all stored in those types keeps the stored codes and
scales: the runner builds each layer linear straight from its blocks
(`StoredInt4`, which the layer builder asks first), packed into the int4
kernels' layout one linear at a time, never as float values and never quantized
again. In float32 the served weights are the stored ones bit for bit; in
bfloat16 the scales (fp16 in the file) and Q4_1's offsets are rounded to
bfloat16 as every int4 scale is, and the codes stay. The output head is int8,
quantized from its values, as on the int4 path everywhere (`models.decoder`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import torch

from sluiceway.runner.checkpoint.block_codes import INT4_BLOCK_TYPES, Int4Blocks
from sluiceway.runner.linear import (
    INT4_GROUP_SIZE,
    Int4Weight,
)
from sluiceway.runner.models.registry import family_for
from sluiceway.runner.models.weights import WeightView
from sluiceway.runner.native.int8_dot import TiledWeight, pack_int4_nibble_tiles
from sluiceway.runner.native.quantized_matmul_f32 import (
    pack_int4_f32,
    quantized_matmul_f32_available,
)
from sluiceway.runner.native.quantized_matvec import int4_matvec_available, pack_int4

_LINEAR_PARTS = {"qkv": ("q", "k", "v"), "o": ("o",), "gate_up": ("gate", "up"), "down": ("down",)}


def _linear_views(config, weights) -> Iterator[tuple[str, tuple[int, ...], list[WeightView | None]]]:
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


def servable_from_blocks(config, weights) -> bool:
    """Whether every layer linear of the checkpoint is stored in Q4_0/Q4_1 with
    shapes the int4 format takes (input a multiple of 32, output of 16)."""
    seen = False
    for _slot, _path, views in _linear_views(config, weights):
        if any(v is None for v in views):
            return False
        rows = 0
        for view in views:
            assert view is not None
            tensor = weights[view.name]
            if getattr(tensor, "type_name", None) not in {t.name for t in INT4_BLOCK_TYPES}:
                return False
            if tensor.shape[-1] % INT4_GROUP_SIZE:
                return False
            rows += (view.rows[1] - view.rows[0]) if view.rows else tensor.shape[-2]
        if rows % 16:
            return False
        seen = True
    return seen


def _blocks(weights, view: WeightView) -> Int4Blocks:
    index: tuple[Any, ...] = ()
    if view.expert is not None:
        index += (view.expert,)
    index += (slice(*view.rows) if view.rows else slice(None),)
    return weights[view.name].int4_blocks(index)


def int4_weight(blocks: Int4Blocks, dtype: torch.dtype) -> Int4Weight:
    """`blocks` in the runtime int4 layouts of `dtype`, as `Int4Weight.quantize`
    would pack the same codes, scales and offsets: the int8-activation kernels'
    tiles where it would pack those, else the native kernel's layout where one
    serves `dtype`, and torch's packing where no native kernel serves every call."""
    cols = blocks.shape[1]
    scale = blocks.scales.to(dtype).float()
    offset = blocks.offsets.to(dtype).float()
    if _tiles_packed(dtype):
        scale_dtype = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
        tiled = pack_int4_nibble_tiles(blocks.nibbles, scale, offset, scale_dtype)
        return Int4Weight(
            packed=None, scales_and_offsets=None, group_size=INT4_GROUP_SIZE, tiled=tiled
        )
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


class StoredInt4:
    """The layer linears a checkpoint stores in Q4_0/Q4_1, as int4 weights of
    `dtype` packed from their blocks: called with a linear's canonical part names
    (`models.layer`'s, e.g. `layers.0.q.weight`, `layers.0.experts.3.down`), the
    fused parts' weight, or None where a part is not stored in 4-bit blocks."""

    def __init__(self, config, weights, dtype: torch.dtype) -> None:
        self._views = family_for(config).weight_views(config, weights)
        self._weights = weights
        self._dtype = dtype
        self._int4_types = {t.name for t in INT4_BLOCK_TYPES}

    def __call__(self, names: list[str]) -> Int4Weight | None:
        blocks = self._stored_blocks(names)
        return None if blocks is None else int4_weight(blocks, self._dtype)

    def rows(self, name: str) -> TiledWeight | None:
        """Weight `name` (the embedding) in `int8_dot`'s tiles, for reading rows
        back (`int8_dot.unpack_rows`) rather than for products: packed whatever
        kernels serve `dtype`, the scales and offsets in `dtype`. None where it is
        not stored in 4-bit blocks."""
        blocks = self._stored_blocks([name])
        if blocks is None:
            return None
        scale_dtype = torch.bfloat16 if self._dtype == torch.bfloat16 else torch.float32
        return pack_int4_nibble_tiles(
            blocks.nibbles,
            blocks.scales.to(self._dtype).float(),
            blocks.offsets.to(self._dtype).float(),
            scale_dtype,
        )

    def _stored_blocks(self, names: list[str]) -> Int4Blocks | None:
        parts = []
        for name in names:
            view = self._views.get(name)
            if view is None:
                return None
            tensor = self._weights[view.name]
            if getattr(tensor, "type_name", None) not in self._int4_types:
                return None
            if tensor.shape[-1] % INT4_GROUP_SIZE:
                return None
            parts.append(view)
        blocks = Int4Blocks.stacked([_blocks(self._weights, v) for v in parts])
        return None if blocks.shape[0] % 16 else blocks
