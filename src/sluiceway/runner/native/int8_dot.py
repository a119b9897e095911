"""`int8_dot`: weight-only int4 and int8 products of a few bfloat16 or float32 rows
with the activations quantized to int8 per block of 32, the dot products in
integers (AVX512-VNNI, AVX-VNNI, AVX2 or portable C, picked at run time; see
`int8_dot.c` for the tiled layout and the arithmetic). `pack_int4_tiles` and
`pack_int8_tiles` lay out `Int4Weight`'s and `Int8Weight`'s values for it at load
time.

`SLUICEWAY_INT8_DOT_ISA` (`avx512vnni`, `avxvnni`, `avx2` or `scalar`) caps the
level, so every path this CPU runs can be exercised; the `level` argument does the
same per call.
"""

from __future__ import annotations

import ctypes
import functools
import os

import attrs
import numpy as np
import torch

from sluiceway.runner.native.library import load_library

_P, _I, _N = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
TILE = 16
BLOCK = 32
LEVELS = ("scalar", "avx2", "avxvnni", "avx512vnni")
# int4 tile scale formats (`int8_dot.c`'s SCALES_): float16 scales and no offsets
# (GGUF's Q4_0 as stored), or a scale and an offset per row and group in bfloat16
# or float32 (the number: bytes of each).
SCALES_F16, SCALES_BF16, SCALES_F32 = 1, 2, 4
_SCALE_FORMATS = {torch.float16: SCALES_F16, torch.bfloat16: SCALES_BF16, torch.float32: SCALES_F32}


def int4_group_bytes(scale_format: int) -> int:
    """Bytes of one group of 32 inputs of an int4 tile (16 rows): the codes, the
    scales and, except in SCALES_F16, the offsets."""
    return 256 + 32 if scale_format == SCALES_F16 else 256 + 32 * scale_format


@functools.cache
def _lib():
    """The library, or None where it does not build."""
    lib = load_library("int8_dot")
    if lib is None:
        return None
    lib.int8_dot.argtypes = [_N, _P, _N, _I, _I, _P, _I, _N, _P, _N, _N, _N]
    lib.int8_dot.restype = _N
    lib.int8_dot_quantize.argtypes = [_P, _N, _I, _I, _P, _P, _P, _N]
    lib.int8_dot_quantize.restype = None
    lib.int8_dot_quantize_rows.argtypes = [_P, _N, _I, _I, _P, _P, _N]
    lib.int8_dot_quantize_rows.restype = None
    lib.int8_dot_pack_int8.argtypes = [_P, _P, _I, _I, _P, _N]
    lib.int8_dot_pack_int8.restype = None
    lib.int8_dot_unpack.argtypes = [_N, _P, _I, _I, _N, _I, _I, _P, _N, _N, _N]
    lib.int8_dot_unpack.restype = _N
    lib.int8_dot_unpack_rows.argtypes = [_N, _P, _I, _I, _N, _P, _I, _P, _N, _N, _N]
    lib.int8_dot_unpack_rows.restype = _N
    lib.int8_dot_pack_q4.argtypes = [_P, _P, _I, _I, _N, _P, _N]
    lib.int8_dot_pack_q4.restype = _N
    lib.int8_dot_best_level.argtypes = []
    lib.int8_dot_best_level.restype = _N
    return lib


@functools.cache
def best_level() -> int:
    """The highest ISA level this CPU runs (an index into `LEVELS`), -1 without the
    library."""
    lib = _lib()
    return -1 if lib is None else int(lib.int8_dot_best_level())


@functools.cache
def level() -> int:
    """The level calls use: the best this CPU runs, capped by
    `SLUICEWAY_INT8_DOT_ISA` where it names a level (read once per process;
    `level.cache_clear()` reads it again)."""
    best = best_level()
    cap = os.environ.get("SLUICEWAY_INT8_DOT_ISA", "").strip().lower()
    if cap:
        if cap not in LEVELS:
            raise ValueError(f"SLUICEWAY_INT8_DOT_ISA={cap!r}: choose one of {', '.join(LEVELS)}")
        return min(best, LEVELS.index(cap))
    return best


def integer_level() -> bool:
    """Whether the level in use does its dot products with SIMD integer instructions
    (AVX2 or better): the portable level is correct but no faster than the float
    kernels, so layers pack for this kernel only where this holds."""
    return level() >= LEVELS.index("avx2")


@attrs.frozen
class TiledWeight:
    """A weight in `int8_dot.c`'s layout: `data` uint8 `[tiles, tile bytes]`."""

    data: torch.Tensor
    bits: int
    out_features: int
    in_features: int
    # int4: SCALES_F16, SCALES_BF16 or SCALES_F32; int8: 4 (a float32 scale a row)
    # or SCALES_F16 (a float16 scale a block of 32: GGUF's Q8_0 as stored)
    scale_format: int

    @property
    def nbytes(self) -> int:
        return self.data.numel()


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t
    return torch.cat([t, t.new_zeros((rows - t.shape[0], *t.shape[1:]))])


def _scales_per_tile(values: torch.Tensor, tiles: int, groups: int) -> torch.Tensor:
    """`[rows, groups]` scales (or offsets), padded with zero rows to whole tiles,
    as the tiles hold them: for each tile and group its 16 rows' values side by
    side, as bytes `[tiles, groups, 16 * itemsize]`."""
    values = _pad_rows(values, tiles * TILE)
    return values.view(tiles, TILE, groups).transpose(1, 2).contiguous().view(torch.uint8)


def pack_int4_tiles(
    q: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor | None, scale_dtype: torch.dtype
) -> TiledWeight:
    """The layout of the weight `(q - 8) * scales + offsets` (`q` integers 0..15
    `[out, in]`, `in` a multiple of 32; `scales` and `offsets` `[out, in / 32]`, stored
    as `scale_dtype`, bfloat16 or float32: values already in that dtype stay exact;
    or float16 scales with `offsets` None, every offset zero: `SCALES_F16`)."""
    out_features, in_features = q.shape
    if in_features % BLOCK:
        raise ValueError(f"int4 tiles need input features divisible by {BLOCK}, not {in_features}")
    grouped = q.to(torch.uint8).view(out_features, -1, BLOCK)
    nibbles = grouped[..., : BLOCK // 2] | (grouped[..., BLOCK // 2 :] << 4)
    return pack_int4_nibble_tiles(nibbles.view(out_features, -1), scales, offsets, scale_dtype)


def pack_int4_nibble_tiles(
    nibbles: torch.Tensor,
    scales: torch.Tensor,
    offsets: torch.Tensor | None,
    scale_dtype: torch.dtype,
) -> TiledWeight:
    """`pack_int4_tiles` of codes given as GGUF's Q4_0/Q4_1 stores them: `nibbles`
    uint8 `[out, in / 2]`, each group's byte j holding code j in its low nibble and
    code j + 16 in its high one. The tiles' 4-byte pieces are those bytes as they
    are, so this only moves them."""
    out_features, half = nibbles.shape
    in_features = 2 * half
    if in_features % BLOCK:
        raise ValueError(f"int4 tiles need input features divisible by {BLOCK}, not {in_features}")
    scale_format = _SCALE_FORMATS.get(scale_dtype)
    if scale_format is None:
        raise ValueError(f"int4 tile scales are float16, bfloat16 or float32, not {scale_dtype}")
    if (offsets is None) != (scale_format == SCALES_F16):
        raise ValueError(
            "int4 tiles hold offsets with bfloat16 or float32 scales only, and need them"
        )
    tiles = -(-out_features // TILE)
    groups = in_features // BLOCK
    words = _pad_rows(nibbles.contiguous(), tiles * TILE).view(torch.int32)
    # (tile, row, group, piece) -> (tile, group, piece, row), 4 bytes each
    pieces = words.view(tiles, TILE, groups, 4).permute(0, 2, 3, 1).contiguous()
    codes = pieces.view(torch.uint8).view(tiles, groups, 256)
    parts = [codes] + [
        _scales_per_tile(values.to(scale_dtype), tiles, groups)
        for values in ([scales] if offsets is None else [scales, offsets])
    ]
    data = torch.cat(parts, dim=2)
    return TiledWeight(
        data=data.reshape(tiles, -1),
        bits=4,
        out_features=out_features,
        in_features=in_features,
        scale_format=scale_format,
    )


def pack_q4_rows(
    rows_at: np.ndarray, kinds: np.ndarray, in_features: int, scale_dtype: torch.dtype
) -> TiledWeight:
    """The tiles of rows stored as GGUF Q4_0/Q4_1/Q4_K blocks, read where they lie:
    row r at address `rows_at[r]` (int64, in a mapping kept alive by the caller)
    of type `kinds[r]` (0 Q4_0, 1 Q4_1, 2 Q4_K). The same tiles as
    `pack_int4_nibble_tiles` of those blocks' codes, scales and offsets
    (`block_codes.int4_blocks`), in one pass and on every thread: with
    `scale_dtype` float16 (Q4_0 rows only) the blocks' own scales and no
    offsets. Needs the library (`available`)."""
    rows_at = np.ascontiguousarray(rows_at, dtype=np.int64)
    kinds = np.ascontiguousarray(kinds, dtype=np.uint8)
    rows = rows_at.shape[0]
    scale_format = _SCALE_FORMATS[scale_dtype]
    tiles = -(-rows // TILE)
    data = torch.empty(
        (tiles, in_features // BLOCK * int4_group_bytes(scale_format)), dtype=torch.uint8
    )
    status = _lib().int8_dot_pack_q4(
        rows_at.ctypes.data, kinds.ctypes.data, rows, in_features, scale_format, data.data_ptr(),
        torch.get_num_threads(),
    )  # fmt: skip
    if status:
        raise ValueError(f"cannot pack {rows} rows of {in_features} 4-bit weights")
    return TiledWeight(
        data=data, bits=4, out_features=rows, in_features=in_features, scale_format=scale_format
    )


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`(q int8 [out, in], scales [out] in weight's dtype)` of a contiguous
    bfloat16 or float32 CPU `weight`, exactly as `linear.Int8Weight.quantize`
    computes them in torch (each row's |w| max / 127 rounded to the dtype, never
    below its smallest normal; codes rounded half to even within -127..127), in
    one pass on every thread; None where the library or the weight does not fit."""
    if (
        weight.dim() != 2
        or weight.dtype not in (torch.bfloat16, torch.float32)
        or weight.device.type != "cpu"
        or not weight.is_contiguous()
        or _lib() is None
    ):
        return None
    rows, k = weight.shape
    q = torch.empty((rows, k), dtype=torch.int8)
    scales = torch.empty(rows, dtype=weight.dtype)
    _lib().int8_dot_quantize_rows(
        weight.data_ptr(), int(weight.dtype == torch.bfloat16), rows, k, q.data_ptr(),
        scales.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    return q, scales


def pack_int8_tiles(q: torch.Tensor, scales: torch.Tensor) -> TiledWeight:
    """The layout of the weight `q * scales[:, None]` (`q` int8 `[out, in]` in
    -127..127, any `in`; `scales` `[out]`, kept as float32)."""
    out_features, in_features = q.shape
    tiles = -(-out_features // TILE)
    blocks = -(-in_features // BLOCK)
    if _lib() is not None and q.is_contiguous():  # the same bytes in one pass
        data = torch.empty((tiles, blocks * 512 + 4 * TILE), dtype=torch.uint8)
        row_scales = scales.to(torch.float32).contiguous()
        _lib().int8_dot_pack_int8(
            q.data_ptr(), row_scales.data_ptr(), out_features, in_features, data.data_ptr(),
            torch.get_num_threads(),
        )  # fmt: skip
        return TiledWeight(
            data=data, bits=8, out_features=out_features, in_features=in_features, scale_format=4
        )
    biased = (q.to(torch.int16) + 128).to(torch.uint8)
    if in_features % BLOCK:  # zero columns: the unsigned 128
        pad = torch.full((out_features, blocks * BLOCK - in_features), 128, dtype=torch.uint8)
        biased = torch.cat([biased, pad], dim=1)
    biased = torch.cat(
        [biased, torch.full((tiles * TILE - out_features, blocks * BLOCK), 128, dtype=torch.uint8)]
    )
    # (tile, row, block, piece, byte) -> (tile, block, piece, row, byte)
    pieces = biased.view(tiles, TILE, blocks, 8, 4).permute(0, 2, 3, 1, 4).reshape(tiles, -1)
    row_scales = _pad_rows(scales.to(torch.float32), tiles * TILE).view(tiles, TILE)
    data = torch.cat([pieces, row_scales.view(torch.uint8)], dim=1).contiguous()
    return TiledWeight(
        data=data, bits=8, out_features=out_features, in_features=in_features, scale_format=4
    )


def pack_int8_block_tiles(q: torch.Tensor, scales: torch.Tensor) -> TiledWeight:
    """The layout of the weight `q * scales` per block of 32 inputs (`q` int8
    `[out, in]` in -127..127, `in` a multiple of 32; `scales` float16 `[out, in /
    32]`: GGUF's Q8_0 codes and d as stored), `SCALES_F16`: 34 bytes a row and
    block, as in the file."""
    out_features, in_features = q.shape
    if in_features % BLOCK:
        raise ValueError(
            f"int8 block tiles need input features divisible by {BLOCK}, not {in_features}"
        )
    if scales.dtype != torch.float16 or scales.shape != (out_features, in_features // BLOCK):
        raise ValueError("int8 block tiles take float16 scales, one per row and block of 32")
    tiles = -(-out_features // TILE)
    blocks = in_features // BLOCK
    biased = (q.to(torch.int16) + 128).to(torch.uint8)
    biased = torch.cat(  # padding rows: the unsigned 128 (zero) with scale 0
        [biased, torch.full((tiles * TILE - out_features, in_features), 128, dtype=torch.uint8)]
    )
    # (tile, row, block, piece, byte) -> (tile, block, piece, row, byte)
    codes = (
        biased.view(tiles, TILE, blocks, 8, 4).permute(0, 2, 3, 1, 4).reshape(tiles, blocks, 512)
    )
    data = torch.cat([codes, _scales_per_tile(scales, tiles, blocks)], dim=2)
    return TiledWeight(
        data=data.reshape(tiles, -1),
        bits=8,
        out_features=out_features,
        in_features=in_features,
        scale_format=SCALES_F16,
    )


def takes(x: torch.Tensor) -> bool:
    """Whether the kernel takes `x`: contiguous bfloat16 or float32 CPU rows."""
    return (
        x.dtype in (torch.bfloat16, torch.float32)
        and x.is_cpu
        and x.dim() == 2
        and x.shape[0] >= 1
        and x.is_contiguous()
        and _lib() is not None
    )


def int8_dot(
    x: torch.Tensor, weight: TiledWeight, *, level_cap: int | None = None, out_dtype=None
) -> torch.Tensor | None:
    """`x [m, in]` times the transposed weight: `[m, out]` in `out_dtype` (default
    `x`'s dtype). None when the kernel does not take `x` (see `takes`). `level_cap`
    caps the ISA level below `level()`. Runs to completion once called and releases
    the GIL."""
    if not takes(x):
        return None
    if x.shape[1] != weight.in_features:
        raise ValueError(f"x has {x.shape[1]} features, the weight takes {weight.in_features}")
    out_dtype = out_dtype or x.dtype
    y = torch.empty((x.shape[0], weight.out_features), dtype=out_dtype)
    use = level() if level_cap is None else min(level(), level_cap)
    status = _lib().int8_dot(
        weight.bits, x.data_ptr(), int(x.dtype == torch.bfloat16), x.shape[0], x.shape[1],
        weight.data.data_ptr(), weight.out_features, weight.scale_format, y.data_ptr(),
        int(out_dtype == torch.bfloat16), use, torch.get_num_threads(),
    )  # fmt: skip
    if status == 2:
        raise MemoryError("int8_dot could not allocate its scratch memory")
    if status:
        raise ValueError("int8_dot refused its arguments")
    return y


def unpack(
    weight: TiledWeight,
    dtype: torch.dtype,
    rows: tuple[int, int] | None = None,
    *,
    level_cap: int | None = None,
) -> torch.Tensor:
    """The weight's values `[out, in]` in `dtype` (bfloat16 or float32), or those of
    output rows `rows` (half-open, the start a multiple of 16): `(q - 8) * scale +
    offset` or `q * scale` in float32, rounded once to `dtype`, the values
    `Int4Weight.quantize` and `Int8Weight.quantize` return for the same weight, at
    every ISA level (`level_cap` caps it as for `int8_dot`). Needs the library
    (`available`). Runs to completion once called and releases the GIL."""
    start, stop = rows if rows is not None else (0, weight.out_features)
    if dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"unpacks to bfloat16 or float32, not {dtype}")
    y = torch.empty((stop - start, weight.in_features), dtype=dtype)
    status = _lib().int8_dot_unpack(
        weight.bits, weight.data.data_ptr(), weight.out_features, weight.in_features,
        weight.scale_format, start, stop - start, y.data_ptr(), int(dtype == torch.bfloat16),
        level() if level_cap is None else min(level(), level_cap), torch.get_num_threads(),
    )  # fmt: skip
    if status:
        raise ValueError(
            f"cannot unpack rows {start}..{stop} of a {weight.out_features}-row weight"
        )
    return y


def unpack_rows(
    weight: TiledWeight, ids: torch.Tensor, dtype: torch.dtype, *, level_cap: int | None = None
) -> torch.Tensor:
    """The values `[len(ids), in]` in `dtype` of output rows `ids` (an embedding
    lookup in a tied head's tiles), as `unpack` gives them. Raises ValueError for
    an id out of range. Runs to completion once called and releases the GIL."""
    if dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"unpacks to bfloat16 or float32, not {dtype}")
    ids = ids.to(device="cpu", dtype=torch.int64).contiguous().view(-1)
    y = torch.empty((ids.numel(), weight.in_features), dtype=dtype)
    status = _lib().int8_dot_unpack_rows(
        weight.bits, weight.data.data_ptr(), weight.out_features, weight.in_features,
        weight.scale_format, ids.data_ptr(), ids.numel(), y.data_ptr(),
        int(dtype == torch.bfloat16), level() if level_cap is None else min(level(), level_cap),
        torch.get_num_threads(),
    )  # fmt: skip
    if status:
        raise ValueError(f"a row id is outside 0..{weight.out_features - 1}")
    return y


def available() -> bool:
    """Whether the kernel library built here."""
    return _lib() is not None


def quantize_activations(
    x: torch.Tensor, level_cap: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the kernel makes of `x [m, in]` (contiguous bfloat16 or float32) at the
    level `int8_dot` would use with `level_cap`: int8 `[m, blocks * 32]`, float32
    block scales and int32 block sums `[m, blocks]`."""
    lib = _lib()
    if lib is None or not takes(x):
        raise ValueError("the kernel library is unavailable or does not take x")
    m, k = x.shape
    blocks = -(-k // BLOCK)
    xq = torch.empty((m, blocks * BLOCK), dtype=torch.int8)
    dx = torch.empty((m, blocks), dtype=torch.float32)
    sx = torch.empty((m, blocks), dtype=torch.int32)
    lib.int8_dot_quantize(
        x.data_ptr(), int(x.dtype == torch.bfloat16), m, k, xq.data_ptr(), dx.data_ptr(),
        sx.data_ptr(), level() if level_cap is None else min(level(), level_cap),
    )  # fmt: skip
    return xq, dx, sx
