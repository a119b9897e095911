"""Layers served on int4 from a GGUF's own 4-bit blocks.

The runtime int4 format has Q4_0's and Q4_1's groups of 32 (`block_codes`), so
a model whose layers are all stored in those types keeps the stored codes and
scales: the runner builds its layers unquantized, from values computed exactly
as its int4 kernels compute them (`ReadOptions.int4_scales_in`), and
`adopt_int4_blocks` then gives each layer's `Linear` the int4 weight packed from
the blocks themselves, instead of quantizing those values again. In float32 the
served weights are the stored ones bit for bit; in bfloat16 the scales (fp16 in
the file) and Q4_1's offsets are rounded to bfloat16 as every int4 scale is, and
the codes stay. The output head is int8, quantized from its values, as on the
int4 path everywhere (`models.decoder`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import torch

from sluiceway.runner.checkpoint.block_codes import INT4_BLOCK_TYPES, Int4Blocks
from sluiceway.runner.checkpoint.gguf_weights import concat_blocks
from sluiceway.runner.linear import (
    INT4_GROUP_SIZE,
    Int4Weight,
    Int8Weight,
    Linear,
    default_quantized_max_rows,
)
from sluiceway.runner.models.registry import family_for
from sluiceway.runner.models.weights import WeightView
from sluiceway.runner.native.int8_dot import pack_int4_tiles
from sluiceway.runner.native.layer_ops import layer_ops_for
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


@functools.cache
def _tiles_packed(dtype: torch.dtype) -> bool:
    """Whether `Int4Weight.quantize` packs a weight of `dtype` for the
    int8-activation kernels here (asked of a 16x64 weight once)."""
    return Int4Weight.quantize(torch.ones(16, 64, dtype=dtype))[0].tiled is not None


def int4_weight(blocks: Int4Blocks, dtype: torch.dtype) -> Int4Weight:
    """`blocks` in the runtime int4 layouts of `dtype`, as `Int4Weight.quantize`
    would pack the same codes, scales and offsets: the int8-activation kernels'
    tiles where it would pack those, else the native kernel's layout where one
    serves `dtype`, and torch's packing always."""
    cols = blocks.codes.shape[1]
    scale = blocks.scales.to(dtype).float()
    offset = blocks.offsets.to(dtype).float()
    native = tiled = None
    if _tiles_packed(dtype):
        scale_dtype = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
        tiled = pack_int4_tiles(blocks.codes, scale, offset, scale_dtype)
    elif cols % 64 == 0:
        if dtype == torch.bfloat16 and int4_matvec_available(cols):
            native = pack_int4(blocks.codes, scale, offset)
        elif dtype == torch.float32 and quantized_matmul_f32_available():
            native = pack_int4_f32(blocks.codes, scale, offset)
    sz = torch.stack([scale, offset], dim=-1)  # [rows, groups, 2]
    return Int4Weight(
        packed=torch.ops.aten._convert_weight_to_int4pack_for_cpu(blocks.codes.to(torch.int32), 1),
        scales_and_offsets=sz.transpose(0, 1).contiguous().to(dtype),
        group_size=INT4_GROUP_SIZE,
        native=native,
        tiled=tiled,
    )


# Rows of the output head quantized at a time: `Int8Weight.quantize` takes four
# float32 copies of what it is given, a gigabyte each for a 128k-token head whole.
_HEAD_ROWS = 8192


def int8_head(weight: torch.Tensor) -> Linear:
    """The output head's `Linear` on int8, as `Linear(weight, quantization="int8")`
    builds it (one scale a row, the dense copy the dequantized rows), quantized a
    few thousand rows at a time: rows are independent, so the result is the same."""
    dtype = weight.dtype
    qs, scales, dense = [], [], []
    for start in range(0, weight.shape[0], _HEAD_ROWS):
        part, values = Int8Weight.quantize(weight[start : start + _HEAD_ROWS])
        qs.append(part.q)
        scales.append(part.scales)
        dense.append(values.to(dtype))
    quantized = Int8Weight(q=torch.cat(qs), scales=torch.cat(scales))
    del qs, scales
    head = Linear(
        torch.cat(dense), quantized_max_rows=default_quantized_max_rows(dtype, output_head=True)
    )
    head.quantized = quantized
    return head


def _linear(model, slot: str, path: tuple[int, ...]) -> Linear:
    layer = model.layers[path[0]]
    if len(path) == 2:
        return getattr(layer.experts.experts[path[1]], slot)
    return getattr(layer, slot)


def adopt_int4_blocks(model, config, weights) -> int:
    """Give every layer linear of `model` (a `DecoderModel` built unquantized from
    `weights` read with `int4_scales_in`) its int4 weight from the stored blocks,
    and the output head its int8 weight, as the int4 path serves them. Returns how
    many linears took stored blocks."""
    dtype = model.dtype
    count = 0
    for slot, path, views in _linear_views(config, weights):
        linear = _linear(model, slot, path)
        blocks = concat_blocks([_blocks(weights, v) for v in views if v is not None])
        linear.quantized = int4_weight(blocks, dtype)
        count += 1
    head = model.embed
    if not model.architecture.tie_word_embeddings:
        view = family_for(config).weight_views(config, weights).get("lm_head")
        if view is not None:
            head = view.read(weights).to(dtype).contiguous()
    model.lm_head = None  # its unquantized copy goes before the int8 one is built
    model.lm_head = int8_head(head)
    # Quantized float32 runs the native layer ops, as `DecoderModel` picks them.
    model.ops = layer_ops_for(dtype, model.device, None, exact_float32=False)
    return count
