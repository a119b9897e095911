"""The int8-activation kernels (`native/int8_dot.c`) on every ISA level this CPU runs,
against the exact integer arithmetic they promise and against the float product of
the same stored weights (within the error that quantizing activations to int8 per
block of 32 allows)."""

from __future__ import annotations

import shutil

import pytest
import torch

from sluiceway.runner.native import int8_dot as kernel

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None or kernel.best_level() < 0, reason="needs a C compiler"
)

LEVELS = list(range(kernel.best_level() + 1))
LEVEL_IDS = [kernel.LEVELS[level] for level in LEVELS]


def _reference_quantize(x: torch.Tensor):
    """The kernel's activation quantization, as the torch ops of its formula."""
    m, k = x.shape
    blocks = -(-k // 32)
    xf = torch.nn.functional.pad(x.float(), (0, blocks * 32 - k)).view(m, blocks, 32)
    d = xf.abs().amax(-1) / 127
    inverse = torch.where(d != 0, 1 / d, torch.zeros_like(d))
    xq = torch.round(xf * inverse[..., None]).clamp(-127, 127)
    return xq.to(torch.int8).view(m, -1), d, xq.sum(-1).to(torch.int32)


def _int4(out_features: int, in_features: int, scale_dtype: torch.dtype, seed: int):
    """Codes, scales and offsets in `scale_dtype`; float16 (`SCALES_F16`, GGUF's
    Q4_0) has zero offsets."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (out_features, in_features), generator=gen)
    groups = in_features // 32
    scales = (torch.rand(out_features, groups, generator=gen) * 0.1 + 1e-3).to(scale_dtype)
    offsets = (torch.randn(out_features, groups, generator=gen) * 0.05).to(scale_dtype)
    if scale_dtype == torch.float16:
        offsets = torch.zeros_like(offsets)
    return q, scales, offsets


def _pack_int4(q, scales, offsets, scale_dtype) -> kernel.TiledWeight:
    """`pack_int4_tiles`, float16 scales without their (zero) offsets."""
    held = None if scale_dtype == torch.float16 else offsets
    return kernel.pack_int4_tiles(q, scales, held, scale_dtype)


SCALE_DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def _int8(out_features: int, in_features: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (out_features, in_features), generator=gen, dtype=torch.int8)
    return q, torch.rand(out_features, generator=gen) * 0.01 + 1e-4


def _rows(m: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    # Uneven magnitudes (an outlier per row) and an all-zero block.
    x = torch.randn(m, k, generator=gen) * torch.rand(m, k, generator=gen) * 2
    x[:, 3] *= 40
    x[0, :32] = 0
    return x.to(dtype)


def _int4_exact(x, q, scales, offsets):
    """float64 of what the kernel computes: per group, scale * dx * (exact integer sum
    of (q - 8) * xq) + offset * dx * (exact sum of xq)."""
    xq, d, sx = _reference_quantize(x)
    m, k = x.shape
    groups = k // 32
    prods = torch.einsum(
        "mgi,ogi->mog", xq.double().view(m, groups, 32), (q - 8).double().view(-1, groups, 32)
    )
    d = d.double()[:, None, :]
    terms = prods * scales.double()[None] * d + offsets.double()[None] * (
        d * sx.double()[:, None, :]
    )
    return terms.sum(-1), terms.abs().sum(-1)


def _int8_exact(x, q, scales):
    xq, d, _ = _reference_quantize(x)
    m, k = x.shape
    blocks = xq.shape[1] // 32
    qp = torch.nn.functional.pad(q.double(), (0, blocks * 32 - k))
    prods = torch.einsum("mbi,obi->mob", xq.double().view(m, blocks, 32), qp.view(-1, blocks, 32))
    terms = prods * d.double()[:, None, :] * scales.double()[None, :, None]
    return terms.sum(-1), terms.abs().sum(-1)


def _quantization_bound(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """How far int8 activations may move a product with `weight` (float64 [out, in]):
    each activation moves by at most half its block's step dx / 2, so
    |error| <= sum over blocks of dx / 2 * sum |w| over the block."""
    _, d, _ = _reference_quantize(x)
    k = x.shape[1]
    blocks = d.shape[1]
    w = torch.nn.functional.pad(weight.abs(), (0, blocks * 32 - k)).view(-1, blocks, 32).sum(-1)
    return (d.double() / 2) @ w.T


def _check(got, exact, magnitude, dtype):
    """float32 sums of a few hundred terms, then the output dtype's rounding."""
    tolerance = magnitude * 1e-5 + 1e-30
    if dtype == torch.bfloat16:
        tolerance = tolerance + exact.abs() * 2**-8
    assert ((got.double() - exact).abs() <= tolerance).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quantized_activations_follow_the_formula(dtype):
    x = _rows(5, 200, dtype, seed=1)
    for level in LEVELS:
        for got, want in zip(
            kernel.quantize_activations(x, level), _reference_quantize(x), strict=True
        ):
            assert torch.equal(got, want)
    aligned = _rows(3, 256, dtype, seed=2)  # the SIMD levels take whole blocks only
    for level in LEVELS:
        for got, want in zip(
            kernel.quantize_activations(aligned, level), _reference_quantize(aligned), strict=True
        ):
            assert torch.equal(got, want)


@pytest.mark.parametrize("level", LEVELS, ids=LEVEL_IDS)
@pytest.mark.parametrize("scale_dtype", SCALE_DTYPES)
@pytest.mark.parametrize("rows", [1, 3, 8, 11])
def test_int4_is_the_integer_arithmetic_it_promises(level, scale_dtype, rows):
    # 40 outputs: two whole tiles of 16 and a part of one.
    q, scales, offsets = _int4(40, 96, scale_dtype, seed=rows)
    packed = _pack_int4(q, scales, offsets, scale_dtype)
    for dtype in (torch.float32, torch.bfloat16):
        x = _rows(rows, 96, dtype, seed=10 + rows)
        exact, magnitude = _int4_exact(x, q, scales, offsets)
        _check(kernel.int8_dot(x, packed, level_cap=level), exact, magnitude, dtype)


@pytest.mark.parametrize("level", LEVELS, ids=LEVEL_IDS)
@pytest.mark.parametrize("shape", [(37, 100), (16, 32), (50, 64)])
@pytest.mark.parametrize("rows", [1, 8, 9])
def test_int8_is_the_integer_arithmetic_it_promises(level, shape, rows):
    # 37x100: neither the outputs a multiple of the tile nor the inputs of the block.
    q, scales = _int8(*shape, seed=rows)
    packed = kernel.pack_int8_tiles(q, scales)
    for dtype in (torch.float32, torch.bfloat16):
        x = _rows(rows, shape[1], dtype, seed=20 + rows)
        exact, magnitude = _int8_exact(x, q, scales)
        _check(kernel.int8_dot(x, packed, level_cap=level), exact, magnitude, dtype)


def _int8_blocks(out_features: int, in_features: int, seed: int):
    """Q8_0's codes and float16 d per block of 32, of very different sizes from
    block to block (the case a scale per row would requantize)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (out_features, in_features), generator=gen, dtype=torch.int8)
    d = torch.rand(out_features, in_features // 32, generator=gen) * 0.01
    d *= torch.logspace(-3, 0, in_features // 32)
    return q, d.half()


@pytest.mark.parametrize("level", LEVELS, ids=LEVEL_IDS)
@pytest.mark.parametrize("rows", [1, 3, 8, 11])
def test_int8_blocks_are_the_integer_arithmetic_they_promise(level, rows):
    """A scale per row and block (GGUF's Q8_0 as stored): per block, d * dx *
    (exact integer sum of q * xq)."""
    q, d = _int8_blocks(40, 96, seed=rows)
    packed = kernel.pack_int8_block_tiles(q, d)
    assert packed.scale_format == kernel.SCALES_F16
    assert packed.nbytes == 3 * 3 * (512 + 32)  # 34 bytes a row and block, as the file
    for dtype in (torch.float32, torch.bfloat16):
        x = _rows(rows, 96, dtype, seed=30 + rows)
        xq, dx, _ = _reference_quantize(x)
        prods = torch.einsum(
            "mbi,obi->mob", xq.double().view(rows, 3, 32), q.double().view(-1, 3, 32)
        )
        terms = prods * dx.double()[:, None, :] * d.double()[None]
        _check(
            kernel.int8_dot(x, packed, level_cap=level), terms.sum(-1), terms.abs().sum(-1), dtype
        )


@pytest.mark.parametrize("level", LEVELS, ids=LEVEL_IDS)
def test_int8_blocks_unpack_to_the_stored_values(level):
    """q * d, exact in float32 (a 7-bit code times an 11-bit mantissa), rounded
    once to bfloat16; whole, by row range and by row id."""
    q, d = _int8_blocks(40, 64, seed=9)
    packed = kernel.pack_int8_block_tiles(q, d)
    values = q.float() * d.float().repeat_interleave(32, 1)
    for dtype in (torch.float32, torch.bfloat16):
        assert torch.equal(kernel.unpack(packed, dtype, level_cap=level), values.to(dtype))
        assert torch.equal(
            kernel.unpack(packed, dtype, (16, 40), level_cap=level), values[16:].to(dtype)
        )
        ids = torch.tensor([39, 0, 17])
        assert torch.equal(
            kernel.unpack_rows(packed, ids, dtype, level_cap=level), values[ids].to(dtype)
        )
    with pytest.raises(ValueError, match="divisible by 32"):
        kernel.pack_int8_block_tiles(q[:, :48], d[:, :1])
    with pytest.raises(ValueError, match="float16 scales"):
        kernel.pack_int8_block_tiles(q, d.float())


@pytest.mark.parametrize("level", LEVELS, ids=LEVEL_IDS)
def test_products_stay_within_activation_quantization_of_the_float_product(level):
    """Against the float product of the stored weights: the int8 activations are
    the whole difference, within its bound (and the bound is not vacuous: the
    products differ from the float ones by more than float32 rounding)."""
    q, scales, offsets = _int4(48, 128, torch.bfloat16, seed=3)
    weight4 = (q - 8).double() * scales.double().repeat_interleave(32, 1)
    weight4 += offsets.double().repeat_interleave(32, 1)
    q8, scales8 = _int8(33, 70, seed=4)
    weight8 = q8.double() * scales8.double()[:, None]
    qb, db = _int8_blocks(33, 64, seed=4)
    weightb = qb.double() * db.double().repeat_interleave(32, 1)
    for packed, weight in (
        (kernel.pack_int4_tiles(q, scales, offsets, torch.bfloat16), weight4),
        (kernel.pack_int8_tiles(q8, scales8), weight8),
        (kernel.pack_int8_block_tiles(qb, db), weightb),
    ):
        x = _rows(4, weight.shape[1], torch.float32, seed=5)
        got = kernel.int8_dot(x, packed, level_cap=level).double()
        want = x.double() @ weight.T
        bound = _quantization_bound(x, weight)
        assert ((got - want).abs() <= bound * 1.001 + 1e-5 * want.abs()).all()
        assert (got - want).abs().max() > 1e-4 * want.abs().max()


@pytest.mark.parametrize("level", LEVELS, ids=LEVEL_IDS)
def test_threads_split_tiles_without_changing_a_bit(level):
    q, scales, offsets = _int4(16 * 7 + 5, 64, torch.bfloat16, seed=6)
    packed = kernel.pack_int4_tiles(q, scales, offsets, torch.bfloat16)
    x = _rows(3, 64, torch.bfloat16, seed=7)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = kernel.int8_dot(x, packed, level_cap=level)
        torch.set_num_threads(3)  # more threads than this machine may have cores
        together = kernel.int8_dot(x, packed, level_cap=level)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(alone, together)
    # A row's result does not depend on the rows beside it.
    assert torch.equal(kernel.int8_dot(x[1:2].contiguous(), packed, level_cap=level), alone[1:2])


def test_refuses_what_it_does_not_take():
    q, scales, offsets = _int4(16, 64, torch.bfloat16, seed=8)
    packed = kernel.pack_int4_tiles(q, scales, offsets, torch.bfloat16)
    assert kernel.int8_dot(torch.randn(1, 64).half(), packed) is None
    assert kernel.int8_dot(torch.randn(64, 2).t(), packed) is None  # not contiguous
    with pytest.raises(ValueError, match="features"):
        kernel.int8_dot(torch.randn(1, 32), packed)
    with pytest.raises(ValueError, match="divisible by 32"):
        kernel.pack_int4_tiles(
            torch.zeros(16, 48, dtype=torch.int64), scales[:, :1], offsets[:, :1], torch.bfloat16
        )
    q16 = torch.zeros(16, 64, dtype=torch.int64)
    with pytest.raises(ValueError, match="offsets"):  # float16 scales hold no offsets
        kernel.pack_int4_tiles(q16, scales.half(), offsets.half(), torch.float16)
    with pytest.raises(ValueError, match="offsets"):  # bfloat16 ones need theirs
        kernel.pack_int4_tiles(q16, scales, None, torch.bfloat16)


def test_the_environment_caps_the_level(monkeypatch):
    kernel.level.cache_clear()
    try:
        monkeypatch.setenv("SLUICEWAY_INT8_DOT_ISA", "scalar")
        assert kernel.level() == 0 and not kernel.integer_level()
        kernel.level.cache_clear()
        monkeypatch.setenv("SLUICEWAY_INT8_DOT_ISA", "avx512vnni")
        assert kernel.level() == kernel.best_level()
        kernel.level.cache_clear()
        monkeypatch.setenv("SLUICEWAY_INT8_DOT_ISA", "sse9")
        with pytest.raises(ValueError, match="SLUICEWAY_INT8_DOT_ISA"):
            kernel.level()
    finally:
        monkeypatch.delenv("SLUICEWAY_INT8_DOT_ISA")
        kernel.level.cache_clear()


def _reference_int4_tiles(q, scales, offsets, scale_dtype) -> torch.Tensor:
    """The tile layout `int8_dot.c` documents, built code by code: per tile and
    group, piece s byte 4r + j = q[r, 32g + 4s + j] | q[r, 32g + 16 + 4s + j] << 4,
    then the 16 rows' scales and offsets (float16: the scales only)."""
    rows, cols = q.shape
    tiles, groups = -(-rows // 16), cols // 32
    padded = torch.zeros(tiles * 16, cols, dtype=torch.int64)
    padded[:rows] = q
    out = []
    for t in range(tiles):
        tile = []
        for g in range(groups):
            block = bytearray(256)
            for s in range(4):
                for r in range(16):
                    for j in range(4):
                        low = int(padded[16 * t + r, 32 * g + 4 * s + j])
                        high = int(padded[16 * t + r, 32 * g + 16 + 4 * s + j])
                        block[64 * s + 4 * r + j] = low | high << 4
            values = []
            held = (scales,) if scale_dtype == torch.float16 else (scales, offsets)
            for part in held:
                column = torch.zeros(16, dtype=scale_dtype)
                column[: min(16, rows - 16 * t)] = part[16 * t : 16 * t + 16, g].to(scale_dtype)
                values.append(column.view(torch.uint8))
            tile.append(torch.cat([torch.tensor(list(block), dtype=torch.uint8), *values]))
        out.append(torch.cat(tile))
    return torch.stack(out)


@pytest.mark.parametrize("scale_dtype", SCALE_DTYPES)
def test_int4_tiles_are_the_documented_layout_from_codes_or_stored_nibbles(scale_dtype):
    """Tiles packed from codes, and from GGUF's Q4_0/Q4_1 code bytes (code j low,
    code j + 16 high: moved, not unpacked), are the layout `int8_dot.c` reads,
    byte for byte, rows past a whole tile too."""
    q, scales, offsets = _int4(20, 64, scale_dtype, seed=9)
    want = _reference_int4_tiles(q, scales, offsets, scale_dtype)
    grouped = q.to(torch.uint8).view(20, 2, 32)
    nibbles = (grouped[..., :16] | (grouped[..., 16:] << 4)).view(20, 32)
    held = None if scale_dtype == torch.float16 else offsets
    from_nibbles = kernel.pack_int4_nibble_tiles(nibbles, scales, held, scale_dtype)
    assert torch.equal(from_nibbles.data, want)
    assert torch.equal(_pack_int4(q, scales, offsets, scale_dtype).data, want)
    assert want.shape[1] == 2 * kernel.int4_group_bytes(from_nibbles.scale_format)
    assert (from_nibbles.out_features, from_nibbles.in_features) == (20, 64)
