"""The codes and scales of GGUF's 32-weight block types, unpacked with torch.

    Q4_0: fp16 d, 16 bytes of nibbles            w = (q - 8) * d      q in 0..15
    Q4_1: fp16 d, fp16 m, 16 bytes of nibbles    w = q * d + m        q in 0..15
    Q8_0: fp16 d, 32 int8                        w = q * d            q in -127..127

A block's byte j holds weight j in its low nibble and weight j + 16 in its high
one. The runtime int4 format (`linear.Int4Weight`) is `w = (q - 8) * scale +
offset` over groups of 32 with the same codes, so a Q4_0 block is `scale = d,
offset = 0` and a Q4_1 block `scale = d, offset = m + 8 d` (`Int4Blocks`).
"""

from __future__ import annotations

import attrs
import numpy as np
import torch
from gguf import GGMLQuantizationType

GROUP = 32
INT4_BLOCK_TYPES = frozenset({GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1})
TORCH_DECODED = INT4_BLOCK_TYPES | {GGMLQuantizationType.Q8_0}


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


def int4_blocks(ggml_type: GGMLQuantizationType, data: np.ndarray, rows: int) -> Int4Blocks:
    """The Q4_0 or Q4_1 bytes `data` (`rows` rows) as `Int4Blocks`, losslessly:
    the same codes, the stored scales, and the Q4_1 offset `m + 8 d` in float32
    (exact there unless the exponents of m and 8 d differ by more than 13)."""
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
        raise ValueError(f"{ggml_type.name} is not a 4-bit block type of 32 weights")
    return Int4Blocks(nibbles, d, offsets)


def q8_0_values(data: np.ndarray, rows: int) -> torch.Tensor:
    """Q8_0 bytes `data` (`rows` rows) as float32 `[rows, cols]`: `q * d`, exact."""
    raw = _blocks(data, rows, 34)
    d = _fp16(raw, 0)
    q = raw[..., 2:].contiguous().view(torch.int8).float()
    q *= d[..., None]
    return q.reshape(rows, -1)
