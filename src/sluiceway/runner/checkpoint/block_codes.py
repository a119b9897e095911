"""The codes and scales of GGUF's 4-bit and 8-bit block types, unpacked with torch.

    Q4_0: fp16 d, 16 bytes of nibbles            w = (q - 8) * d      q in 0..15
    Q4_1: fp16 d, fp16 m, 16 bytes of nibbles    w = q * d + m        q in 0..15
    Q8_0: fp16 d, 32 int8                        w = q * d            q in -127..127
    Q4_K: 256 weights: fp16 d, fp16 dmin, 12 bytes of eight 6-bit (sc, m) pairs,
          128 bytes of nibbles                   w = d sc q - dmin m  q in 0..15

A Q4_0/Q4_1 block's byte j holds weight j in its low nibble and weight j + 16
in its high one. A Q4_K block's eight sub-blocks of 32 weights take their
nibbles from four runs of 32 bytes: run r's low nibbles are sub-block 2r, its
high ones sub-block 2r + 1 (ggml's `dequantize_row_q4_K`). The runtime int4
format (`linear.Int4Weight`) is `w = (q - 8) * scale + offset` over groups of
32 with the same codes, so a Q4_0 block is `scale = d, offset = 0`, a Q4_1
block `scale = d, offset = m + 8 d`, and a Q4_K sub-block `scale = d sc,
offset = 8 d sc - dmin m` (`Int4Blocks`).
"""

from __future__ import annotations

import attrs
import numpy as np
import torch
from gguf import GGMLQuantizationType

GROUP = 32
# The 4-bit types served as stored, by the kind number `int8_dot.pack_q4_rows`
# takes for each when it reads their rows straight from the mapped file.
ROW_PACKED_INT4 = {
    GGMLQuantizationType.Q4_0: 0,
    GGMLQuantizationType.Q4_1: 1,
    GGMLQuantizationType.Q4_K: 2,
}
INT4_BLOCK_TYPES = frozenset(ROW_PACKED_INT4)
_Q4_K_BYTES = 144


@attrs.frozen
class Int4Blocks:
    """Rows of 4-bit blocks as the runtime int4 format reads them: `nibbles`
    uint8 `[rows, cols / 2]`, each group's 16 bytes as stored (byte j: weight j
    in the low nibble, weight j + 16 in the high one), `scales` and `offsets`
    float32 `[rows, cols / 32]`, each weight `(code - 8) * scale + offset` of its
    group."""

    nibbles: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        rows, half = self.nibbles.shape
        return rows, 2 * half

    @property
    def codes(self) -> torch.Tensor:
        """The codes, uint8 `[rows, cols]` in 0..15 in weight order."""
        rows, cols = self.shape
        grouped = self.nibbles.view(rows, -1, GROUP // 2)
        codes = torch.empty((rows, cols // GROUP, GROUP), dtype=torch.uint8)
        torch.bitwise_and(grouped, 0xF, out=codes[..., : GROUP // 2])
        torch.bitwise_right_shift(grouped, 4, out=codes[..., GROUP // 2 :])
        return codes.view(rows, cols)

    def rows(self, index) -> Int4Blocks:
        """The rows `index` (a slice or an index tensor) of every part."""
        return Int4Blocks(self.nibbles[index], self.scales[index], self.offsets[index])

    @classmethod
    def stacked(cls, parts: list[Int4Blocks]) -> Int4Blocks:
        """Row-wise concatenation, as a fused layer stacks its parts."""
        if len(parts) == 1:
            return parts[0]
        return cls(
            torch.cat([p.nibbles for p in parts]),
            torch.cat([p.scales for p in parts]),
            torch.cat([p.offsets for p in parts]),
        )

    def values(self) -> torch.Tensor:
        """The weights in float32: exactly the stored values."""
        rows, cols = self.shape
        q = self.codes.view(rows, -1, GROUP).float()
        q -= 8.0
        q *= self.scales[:, :, None]
        q += self.offsets[:, :, None]
        return q.reshape(rows, cols)


def _fp16(raw: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 at byte `start` of every block of `raw [rows, blocks, size]`, as float32."""
    return raw[..., start : start + 2].contiguous().view(torch.float16)[..., 0].float()


def _nibbles(raw: torch.Tensor, start: int) -> torch.Tensor:
    """The 16 code bytes of every block, `[rows, blocks * 16]` uint8 as stored."""
    rows = raw.shape[0]
    return raw[..., start : start + GROUP // 2].reshape(rows, -1).contiguous()


def _blocks(data: np.ndarray, rows: int, size: int) -> torch.Tensor:
    # A copy: the mapping is read-only, and torch would warn about a view of it.
    return torch.from_numpy(np.array(data)).view(rows, -1, size)


def _q4_k(data: np.ndarray, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K bytes as (codes uint8 `[rows, groups, 32]` in weight order, `d sc`
    and `dmin m` float32 `[rows, groups]`), groups of 32 weights."""
    raw = _blocks(data, rows, _Q4_K_BYTES)
    d, dmin = _fp16(raw, 0), _fp16(raw, 2)
    packed = raw[..., 4:16].to(torch.int32)
    low, high, top = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    # ggml's get_scale_min_k4: sub-blocks 0-3 in the low six bits of the first
    # eight bytes, 4-7 from the last four bytes and the first eight's top bits.
    sc = torch.cat([low & 63, (top & 0xF) | ((low >> 6) << 4)], dim=-1).float()
    m = torch.cat([high & 63, (top >> 4) | ((high >> 6) << 4)], dim=-1).float()
    runs = raw[..., 16:].reshape(rows, raw.shape[1], 4, 32)
    codes = torch.stack([runs & 0xF, runs >> 4], dim=3).reshape(rows, -1, GROUP)
    return codes, (d[..., None] * sc).reshape(rows, -1), (dmin[..., None] * m).reshape(rows, -1)


def q4_k_values(data: np.ndarray, rows: int) -> torch.Tensor:
    """Q4_K bytes `data` (`rows` rows) as float32 `[rows, cols]`, computed as
    ggml and gguf-py compute them (`d sc * q - dmin m`), so bit for bit theirs."""
    codes, scale, minimum = _q4_k(data, rows)
    return (scale[..., None] * codes.float() - minimum[..., None]).reshape(rows, -1)


def int4_blocks(ggml_type: GGMLQuantizationType, data: np.ndarray, rows: int) -> Int4Blocks:
    """The Q4_0, Q4_1 or Q4_K bytes `data` (`rows` rows) as `Int4Blocks`,
    losslessly: the same codes, the stored scales (Q4_K's `d sc`), and the
    offset in float32 (Q4_1's `m + 8 d`, Q4_K's `8 d sc - dmin m`; exact unless
    the exponents of their two terms differ by more than 13)."""
    if ggml_type == GGMLQuantizationType.Q4_K:
        codes, scale, minimum = _q4_k(data, rows)
        nibbles = codes[..., : GROUP // 2] | (codes[..., GROUP // 2 :] << 4)
        return Int4Blocks(nibbles.reshape(rows, -1).contiguous(), scale, 8.0 * scale - minimum)
    if ggml_type == GGMLQuantizationType.Q4_0:
        raw = _blocks(data, rows, 18)
        d = _fp16(raw, 0)
        offsets = torch.zeros_like(d)
        nibbles = _nibbles(raw, 2)
    elif ggml_type == GGMLQuantizationType.Q4_1:
        raw = _blocks(data, rows, 20)
        d, m = _fp16(raw, 0), _fp16(raw, 2)
        offsets = m + 8.0 * d
        nibbles = _nibbles(raw, 4)
    else:
        raise ValueError(f"{ggml_type.name} is not a 4-bit block type")
    return Int4Blocks(nibbles, d, offsets)


def q8_0_values(data: np.ndarray, rows: int) -> torch.Tensor:
    """Q8_0 bytes `data` (`rows` rows) as float32 `[rows, cols]`: `q * d`, exact."""
    raw = _blocks(data, rows, 34)
    d = _fp16(raw, 0)
    q = raw[..., 2:].contiguous().view(torch.int8).float()
    q *= d[..., None]
    return q.reshape(rows, -1)
