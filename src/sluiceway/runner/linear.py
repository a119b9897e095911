"""Linear layers for the runner: plain, oneDNN-prepacked, or weight-only quantized.

On CPU, `F.linear` in bfloat16 reorders the weight into oneDNN's blocked layout on
every call; for a large output projection that reorder costs more than the
matmul itself. Packing
once at load time removes it and gives bit-identical results. float32 keeps
`F.linear` (MKL), so float32 output stays exactly what transformers computes.

Weight-only quantization (`"int8"`: one scale per output row; `"int4"`: groups of
32 inputs with a scale and an offset each, the layout of llama.cpp's Q4_1) makes a
decode step read a half or a quarter of bfloat16's weight bytes. Where the CPU
has integer SIMD dot products (AVX2, AVX-VNNI, AVX512-VNNI), a bfloat16 quantized
weight is packed at construction into `native/int8_dot.c`'s tiles, whichever way
it was built (quantized here, or from a checkpoint's own blocks): that kernel
quantizes the activations to int8 per block of 32 and reads each weight byte
once, near the memory bound at few rows (`benchmarks/decode_bound.py`). float32
keeps its float kernels (`native/quantized_matmul_f32.c`), which serve any row
count as well.

A quantized layer holds only its quantized bytes by default, and those kernels
serve every call, but for calls of `DEQUANTIZED_MIN_ROWS` rows and more on
tiles (long prompts), which multiply by the values unpacked from the tiles a
slab at a time, densely. From about 8 rows on (16 in float32) a dense matmul of
a weight kept dequantized is faster still (`benchmarks/linear_paths.py`: about
3x `int8_dot` at 512 rows in bfloat16), so `dense_copy` keeps the dequantized
values as well, packed densely, for calls of more than `quantized_max_rows`
rows: faster prefill and large batches, at four (bfloat16) to eight (float32)
times the weight memory.
Both compute with the same weight values, so a sequence sees the same model
whichever path its batch takes (the kernels round differently, a rounding apart).
The quantized kernels are CPU kernels, so quantization is refused on other
devices.
"""

from __future__ import annotations

import sys

import attrs
import torch
import torch.nn.functional as F

from sluiceway.runner.native import int8_dot as int8_dot_kernel
from sluiceway.runner.native.int8_dot import TiledWeight, pack_int4_tiles, pack_int8_tiles
from sluiceway.runner.native.quantized_matmul_f32 import (
    int4_matmul_f32,
    int8_matmul_f32,
    pack_int4_f32,
    quantized_matmul_f32_available,
)
from sluiceway.runner.native.quantized_matvec import (
    int4_matvec,
    int4_matvec_available,
    int8_matvec,
    pack_int4,
)

QUANTIZATIONS = (None, "int8", "int4")
INT4_GROUP_SIZE = 32
# Calls with more rows than this take the dense path; see the module docstring.
QUANTIZED_MAX_ROWS = 8
# Rows `Int8Weight.quantize` takes at a time.
_QUANTIZE_ROWS = 8192
# From this many rows on, a layer without a dense copy multiplies by its values
# unpacked from the tiles a slab of output rows at a time (`_SLAB_ELEMENTS`
# weights, a few MB that stay in the heap between calls), densely: at 128 rows
# and more that is faster than `int8_dot` (`benchmarks/dense_copies.py`).
DEQUANTIZED_MIN_ROWS = 128
_SLAB_ELEMENTS = 1 << 22
# float32 with the AVX2 kernels (benchmarks/linear_paths.py --rows 8,16,24,32): up
# to 16 rows the layers' int4 products are at least as fast as the dense ones, from
# 24 the dense product wins. The output head's dense product is slow at few rows,
# so its int8 kernel wins up to 32. The figures: docs/benchmarks.md.
FLOAT32_QUANTIZED_MAX_ROWS = 16
FLOAT32_HEAD_QUANTIZED_MAX_ROWS = 32

# Whether layers built from now on pack their weights for the int8-activation
# kernels (`native/int8_dot.py`): None lets the CPU decide; benchmarks set it to
# compare both kernel sets in one process.
_int8_activation_kernels: bool | None = None


def use_int8_activation_kernels(on: bool | None) -> None:
    """Force (True), refuse (False) or leave to the CPU (None) the int8-activation
    kernels for layers constructed after this call."""
    global _int8_activation_kernels
    _int8_activation_kernels = on


def _tiles_wanted(weight: torch.Tensor) -> bool:
    """Whether a CPU weight of this dtype is packed for `int8_dot`: by default
    bfloat16 ones where a level with integer SIMD dot products runs here; forced
    on, float32 ones as well. float32 keeps its float kernels by default: their
    products are those of the stored weights to float32 rounding, which its
    batch-size and tensor-parallel parity rests on; int8 activations move them
    by up to half an activation step per block (`tests/runner/test_int8_dot.py`)."""
    if weight.device.type != "cpu" or weight.dtype not in (torch.bfloat16, torch.float32):
        return False
    if _int8_activation_kernels is not None:
        return _int8_activation_kernels and int8_dot_kernel.best_level() >= 0
    return weight.dtype == torch.bfloat16 and int8_dot_kernel.integer_level()


def _native_codes(native: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The codes `[out, in]` (0..15) of a native int4 packing of a `dtype` weight:
    `pack_int4`'s bfloat16 one or `pack_int4_f32`'s float32 one (each row: the
    nibbles, then a scale and an offset or bias per group of 32)."""
    out_features, row_bytes = native.shape
    scale_bytes = 2 if dtype == torch.bfloat16 else 4
    # nibbles in / 2 bytes, then in / 32 scales and as many offsets (or biases)
    in_features = row_bytes * 32 // (16 + 2 * scale_bytes)
    nibbles = native[:, : in_features // 2].reshape(out_features, -1, 1, 32)
    return torch.cat([nibbles & 15, nibbles >> 4], dim=2).reshape(out_features, in_features)


def _tiled_matmul(tiled: TiledWeight | None, x: torch.Tensor) -> torch.Tensor | None:
    """`int8_dot` of `x` where the layer has tiles and the kernel takes `x`; None
    otherwise. It serves every row count the quantized path gets (in passes of 8
    rows over the weight)."""
    if tiled is None:
        return None
    return int8_dot_kernel.int8_dot(x, tiled)


def _mkldnn_packable(weight: torch.Tensor) -> bool:
    """Whether oneDNN can prepack `weight` on this CPU. Its float16 path needs
    AVX-NE-CONVERT or AVX512-FP16 (packing raises without them, e.g. on AMD EPYC Zen 5),
    so half precision is checked the same way oneDNN checks it."""
    if not (
        weight.device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    ):
        return False
    if weight.dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if weight.dtype == torch.float16:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return False


def _quantize_rows(
    weight: torch.Tensor, row_absmax: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`Int8Weight.quantize`'s codes and scales in torch (`int8_dot.quantize_rows`
    computes the same in C where it can)."""
    qs, all_scales = [], []
    # A few thousand rows at a time: the float32 temporaries of a whole
    # 128k-token output head are a gigabyte each. Rows are independent.
    for start in range(0, weight.shape[0], _QUANTIZE_ROWS):
        w = weight[start : start + _QUANTIZE_ROWS].to(torch.float32)
        if row_absmax is None:
            absmax = w.abs().amax(dim=1)
        else:
            absmax = row_absmax[start : start + _QUANTIZE_ROWS].to(torch.float32)
        scales = _positive_in(weight.dtype, absmax / 127.0)
        q = torch.round(w / scales.float()[:, None]).clamp(-127, 127)
        del w
        qs.append(q.to(torch.int8))
        all_scales.append(scales)
    return torch.cat(qs), torch.cat(all_scales)


def _positive_in(dtype: torch.dtype, scales: torch.Tensor) -> torch.Tensor:
    """`scales` in `dtype`, never zero there: an all-zero row or a constant group
    would otherwise divide 0 by 0 (1e-10 itself rounds to 0 in float16)."""
    return scales.to(dtype).clamp(min=torch.finfo(dtype).tiny)


@attrs.frozen
class Int8Weight:
    """Symmetric per-output-row int8: `w ~= q * scales[:, None]`; or, with `scales`
    None, tiles with a scale per row and block of 32 (a checkpoint's Q8_0 blocks
    as stored, `int8_dot.pack_int8_block_tiles`)."""

    # int8 [out, in]; None once `tiled` holds the same values (nothing else reads it).
    q: torch.Tensor | None
    scales: torch.Tensor | None  # [out], the activation dtype; None: in the tiles
    # The same values in `int8_dot`'s layout, packed at construction where that
    # kernel runs (see `_tiles_wanted`); None elsewhere.
    tiled: TiledWeight | None = attrs.field(default=None, eq=False)

    def __attrs_post_init__(self) -> None:
        if self.scales is None and self.tiled is None:
            raise ValueError("an int8 weight without row scales needs its block tiles")
        if self.tiled is None and self.q is not None and self.q.dim() == 2:
            assert self.scales is not None
            if _tiles_wanted(self.scales):
                object.__setattr__(self, "tiled", pack_int8_tiles(self.q, self.scales))
        if self.tiled is not None:
            object.__setattr__(self, "q", None)

    def serves_every_row_count(self) -> bool:
        """Whether `matmul` runs on a kernel at any row count (so a layer needs no
        dense copy): `int8_dot`'s tiles, or float32's native kernel."""
        if self.tiled is not None:
            return True
        assert self.q is not None and self.scales is not None
        return (
            self.scales.dtype == torch.float32
            and self.q.shape[1] % 32 == 0
            and quantized_matmul_f32_available()
        )

    def values(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight's values `[out, in]` in `dtype`: what `quantize` returned."""
        if self.tiled is not None:
            return int8_dot_kernel.unpack(self.tiled, dtype)
        assert self.q is not None and self.scales is not None
        return (self.q * self.scales.float()[:, None]).to(dtype)

    @classmethod
    def quantize(
        cls,
        weight: torch.Tensor,
        row_absmax: torch.Tensor | None = None,
        *,
        want_values: bool = True,
    ) -> tuple[Int8Weight, torch.Tensor | None]:
        """The quantized weight and its float32 dequantized values (None without
        `want_values`). `row_absmax`
        (`[out]`, in `weight`'s dtype) is the largest |weight| of each whole row
        when `weight` holds only some of its columns (a tensor-parallel rank's
        row-parallel slice): each row is then scaled as the whole row is on one
        device, so the slices' partial products sum to that device's product."""
        native = int8_dot_kernel.quantize_rows(weight) if row_absmax is None else None
        q, scales = native if native is not None else _quantize_rows(weight, row_absmax)
        if not want_values:
            return cls(q=q, scales=scales), None
        values = q.to(torch.float32)
        values *= scales.float()[:, None]
        return cls(q=q, scales=scales), values

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        # Decode rows: the int8-activation kernel where the layer has its tiles,
        # else the float kernels where they take them (bfloat16 at one row,
        # float32 at any count), torch's otherwise.
        y = _tiled_matmul(self.tiled, x)
        if y is not None:
            return y
        assert self.q is not None and self.scales is not None
        if x.dtype is torch.float32:
            y = int8_matmul_f32(x, self.q, self.scales)
            if y is not None:
                return y
        elif x.shape[0] == 1:
            y = int8_matvec(x, self.q, self.scales)
            if y is not None:
                return y
        return torch._weight_int8pack_mm(x, self.q, self.scales)


@attrs.frozen
class Int4Weight:
    """Asymmetric int4 in groups of `group_size` inputs: for a weight in group g,
    `w ~= (q - 8) * scale[g] + offset[g]` with `q` in 0..15 (llama.cpp's Q4_1 up to
    where the offset sits).

    Held in one of three ways, each computing with the same weight values:
    `int8_dot`'s tiles (`tiled`, the scales and offsets inside), which serve every
    call; float32's native layout (`native`, with AVX2), where `int4_matmul_f32`
    serves every call (torch's kernel is several times slower than a dense float32
    product there); or torch's packing for `_weight_int4pack_mm_for_cpu` (`packed`
    with `scales_and_offsets`), with bfloat16's native layout beside it where
    `int4_matvec` serves calls of one row (AVX512-BF16, `native/quantized_matvec.c`)."""

    # uint8, torch's layout; None where `tiled` or float32's `native` serves every
    # call (`serves_every_row_count`), which torch's kernel then never does.
    packed: torch.Tensor | None
    # [in // group_size, out, 2], the activation dtype; None once `tiled` holds them
    scales_and_offsets: torch.Tensor | None
    group_size: int
    native: torch.Tensor | None = None  # uint8, `pack_int4`'s layout
    # The same values in `int8_dot`'s layout where that kernel runs (see
    # `_tiles_wanted`); `native` is then not kept.
    tiled: TiledWeight | None = attrs.field(default=None, eq=False)

    def __attrs_post_init__(self) -> None:
        if self.serves_every_row_count():
            object.__setattr__(self, "packed", None)
        if self.tiled is not None:
            object.__setattr__(self, "scales_and_offsets", None)

    def serves_every_row_count(self) -> bool:
        """Whether `matmul` runs on a native kernel at any row count (so a layer
        needs no dense copy): `int8_dot`'s tiles, or float32's native kernel."""
        sz = self.scales_and_offsets
        return self.tiled is not None or (
            self.native is not None and sz is not None and sz.dtype == torch.float32
        )

    def values(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight's values `[out, in]` in `dtype`: `(q - 8) * scale + offset`
        in float32, rounded once, what `quantize` returned. Held as tiles or a
        native packing only (torch's packing is not read back)."""
        if self.tiled is not None:
            return int8_dot_kernel.unpack(self.tiled, dtype)
        sz = self.scales_and_offsets
        if self.native is None or sz is None:
            raise ValueError("torch's int4 packing is not read back; only tiles and native ones")
        q = _native_codes(self.native, sz.dtype)
        scales, offsets = sz.float().unbind(-1)  # [groups, out]
        out_features, in_features = q.shape
        grouped = q.float().reshape(out_features, -1, self.group_size)
        values = (grouped - 8.0) * scales.T[..., None] + offsets.T[..., None]
        return values.reshape(out_features, in_features).to(dtype)

    @classmethod
    def quantize(
        cls, weight: torch.Tensor, group_size: int = INT4_GROUP_SIZE
    ) -> tuple[Int4Weight, torch.Tensor]:
        """The quantized weight and its float32 dequantized values."""
        out_features, in_features = weight.shape
        if in_features % group_size or out_features % 16:
            raise ValueError(
                f"int4 needs input features divisible by {group_size} and output features "
                f"divisible by 16, not a {out_features}x{in_features} weight"
            )
        w = weight.to(torch.float32).reshape(out_features, -1, group_size)
        low = w.amin(dim=-1, keepdim=True)
        # Scale and offset are rounded to the activation dtype first, so both paths
        # start from the same scale and offset (the kernel's products round
        # differently in half precision; in float32 the paths agree).
        scale = _positive_in(weight.dtype, (w.amax(dim=-1, keepdim=True) - low) / 15.0).float()
        q = torch.round((w - low) / scale).clamp(0, 15)
        offset = (low + 8.0 * scale).to(weight.dtype).float()
        sz = torch.cat([scale, offset], dim=-1)  # [out, groups, 2]
        dequantized = ((q - 8.0) * scale + offset).reshape(out_features, in_features)
        q_rows = q.to(torch.int32).reshape(out_features, in_features)
        native = tiled = None
        if group_size == 32 and _tiles_wanted(weight):
            scale_dtype = torch.bfloat16 if weight.dtype == torch.bfloat16 else torch.float32
            tiled = pack_int4_tiles(q_rows, scale[..., 0], offset[..., 0], scale_dtype)
        elif group_size == 32 and weight.device.type == "cpu" and in_features % 64 == 0:
            if weight.dtype == torch.bfloat16 and int4_matvec_available(in_features):
                native = pack_int4(q_rows, scale[..., 0], offset[..., 0])
            elif weight.dtype == torch.float32 and quantized_matmul_f32_available():
                native = pack_int4_f32(q_rows, scale[..., 0], offset[..., 0])
        packed = cls(
            packed=None if tiled is not None or (native is not None and weight.dtype == torch.float32)
            else torch.ops.aten._convert_weight_to_int4pack_for_cpu(q_rows, 1),
            scales_and_offsets=sz.transpose(0, 1).contiguous().to(weight.dtype),
            group_size=group_size,
            native=native,
            tiled=tiled,
        )
        return packed, dequantized

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        y = _tiled_matmul(self.tiled, x)
        if y is not None:
            return y
        if self.native is not None:
            if x.dtype is torch.float32:
                y = int4_matmul_f32(x, self.native)
            else:
                y = int4_matvec(x, self.native) if x.shape[0] == 1 else None
            if y is not None:
                return y
        assert self.packed is not None and self.scales_and_offsets is not None, (
            "every call takes a native kernel"
        )
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            x, self.packed, self.group_size, self.scales_and_offsets
        )


def default_quantized_max_rows(dtype: torch.dtype, *, output_head: bool = False) -> int:
    """Up to how many rows a quantized layer of `dtype` is faster on its quantized
    kernel than on its dense weight (see the constants above)."""
    if dtype == torch.float32 and quantized_matmul_f32_available():
        return FLOAT32_HEAD_QUANTIZED_MAX_ROWS if output_head else FLOAT32_QUANTIZED_MAX_ROWS
    return QUANTIZED_MAX_ROWS


class Linear:
    """`y = x @ weight.T + bias` for `x [T, in]`, in the weight's dtype.

    `kind` says how the weight is stored: "plain" (as given, `F.linear`),
    "mkldnn" (prepacked by oneDNN) or "quantized" (only `quantized`, no dense
    copy). With `quantization`, `quantized` holds the quantized weight, used for
    calls of at most `quantized_max_rows` rows on CPU (None:
    `default_quantized_max_rows`). With `dense_copy` the dense weight is kept
    beside it, the dequantized values, for larger calls; without it (where the
    quantized weight serves every row count, `serves_every_row_count`) the
    quantized weight serves every call and the layer holds only its quantized
    bytes. `row_absmax` scales int8 rows by whole rows that `weight` holds only
    some columns of (see `Int8Weight.quantize`)."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        quantization: str | None = None,
        quantized_max_rows: int | None = None,
        row_absmax: torch.Tensor | None = None,
        dense_copy: bool = False,
    ) -> None:
        if quantization not in QUANTIZATIONS:
            raise ValueError(
                f"unknown quantization {quantization!r}; choose one of int8, int4 or None"
            )
        if quantization is not None and weight.device.type != "cpu":
            raise ValueError(
                f"weight-only {quantization} runs on CPU only, not on {weight.device.type}"
            )
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.dtype = weight.dtype
        self.quantized: Int8Weight | Int4Weight | None = None
        if quantized_max_rows is None:
            quantized_max_rows = default_quantized_max_rows(weight.dtype)
        self.quantized_max_rows = quantized_max_rows
        if quantization is None:
            self._store_dense(weight)
            return
        if quantization == "int8":
            self.quantized, values = Int8Weight.quantize(
                weight, row_absmax, want_values=dense_copy
            )
        else:
            self.quantized, values = Int4Weight.quantize(weight)
        if not dense_copy and self.quantized.serves_every_row_count():
            self._quantized_only()
            return
        if values is None:
            values = self.quantized.values(torch.float32)
        self._store_dense(values.to(weight.dtype))

    @classmethod
    def from_quantized(
        cls,
        quantized: Int8Weight | Int4Weight,
        dtype: torch.dtype,
        bias: torch.Tensor | None = None,
        *,
        quantized_max_rows: int | None = None,
        dense_copy: bool = False,
    ) -> Linear:
        """A layer over a weight already quantized (a checkpoint's own blocks),
        computing in `dtype`, with or without its dense copy as `__init__`."""
        layer = cls.__new__(cls)
        layer.quantized = quantized
        layer.bias = bias
        layer.dtype = dtype
        if quantized.tiled is not None:
            layer.out_features = quantized.tiled.out_features
            layer.in_features = quantized.tiled.in_features
        elif isinstance(quantized, Int8Weight):
            assert quantized.q is not None
            layer.out_features, layer.in_features = quantized.q.shape
        else:
            assert quantized.scales_and_offsets is not None
            groups, layer.out_features, _ = quantized.scales_and_offsets.shape
            layer.in_features = groups * quantized.group_size
        if quantized_max_rows is None:
            quantized_max_rows = default_quantized_max_rows(dtype)
        layer.quantized_max_rows = quantized_max_rows
        if not dense_copy and quantized.serves_every_row_count():
            layer._quantized_only()
        else:
            layer._store_dense(quantized.values(dtype))
        return layer

    weight: torch.Tensor | None  # None for kind "quantized"

    def _through_slabs(self, tiled: TiledWeight, x: torch.Tensor) -> torch.Tensor:
        """`x` times the weight's values, unpacked a slab of output rows at a time
        and multiplied densely (see `DEQUANTIZED_MIN_ROWS`)."""
        rows = max(16, _SLAB_ELEMENTS // self.in_features // 16 * 16)
        y = torch.empty((x.shape[0], self.out_features), dtype=x.dtype)
        for start in range(0, self.out_features, rows):
            stop = min(self.out_features, start + rows)
            y[:, start:stop] = F.linear(x, int8_dot_kernel.unpack(tiled, x.dtype, (start, stop)))
        return y

    def _quantized_only(self) -> None:
        self.kind = "quantized"
        self.weight = None
        self.quantized_max_rows = sys.maxsize

    def _store_dense(self, weight: torch.Tensor) -> None:
        if _mkldnn_packable(weight):
            self.kind = "mkldnn"
            # No batch-size hint: oneDNN then picks a layout that serves every batch
            # size. A hint of 1 made large-batch decode steps slower
            # (benchmarks/runner_ab.py) and, past a few hundred rows, no longer
            # matched F.linear bit for bit; without the hint it matches at every size.
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight)
        else:
            self.kind = "plain"
            self.weight = weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.quantized is not None and x.shape[0] <= self.quantized_max_rows:
            tiled = self.quantized.tiled
            if self.weight is None and tiled is not None and x.shape[0] >= DEQUANTIZED_MIN_ROWS:
                out = self._through_slabs(tiled, x)
            else:
                out = self.quantized.matmul(x.contiguous())
            return out if self.bias is None else out + self.bias
        assert self.weight is not None, "a layer without a dense copy takes every call above"
        if self.kind == "mkldnn":
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)
