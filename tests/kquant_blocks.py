"""Q6_K and Q4_K blocks encoded in numpy, for GGUF test files: gguf-py
dequantizes every K-quant but quantizes none of them. The layouts are ggml's
`block_q6_K` (ql[128] low nibbles, qh[64] high two bits, 16 int8 sub-block
scales, fp16 d) and `block_q4_K` (fp16 d and dmin, eight 6-bit scale and min
pairs in 12 bytes, qs[128]); the rounding is simpler than llama.cpp's search,
which the tests do not need."""

from __future__ import annotations

import numpy as np

Q6_K_BLOCK = 256
Q4_K_BLOCK = 256


def quantize_q6_k(values: np.ndarray) -> np.ndarray:
    """`values [rows, cols]` (cols a multiple of 256) as Q6_K bytes `[rows, cols / 256 * 210]`."""
    rows, cols = values.shape
    x = values.astype(np.float32).reshape(-1, 16, 16)  # [blocks, sub-blocks, 16]
    sub = np.abs(x).max(axis=-1) / 31.0  # the sub-blocks' scales, codes in -32..31
    d = (sub.max(axis=-1) / 127.0).astype(np.float16)  # [blocks]
    d32 = d.astype(np.float32)
    safe_d = np.where(d32 == 0, 1.0, d32)
    sc = np.clip(np.round(sub / safe_d[:, None]), -128, 127).astype(np.int8)  # [blocks, 16]
    step = d32[:, None] * sc.astype(np.float32)  # [blocks, 16]
    safe_step = np.where(step == 0, 1.0, step)
    q = np.clip(np.round(x / safe_step[..., None]), -32, 31).astype(np.int32) + 32
    q = q.reshape(-1, 2, 4, 32)  # [blocks, half, quarter, l]: y[128 h + 32 k + l]
    q1, q2, q3, q4 = (q[:, :, k] for k in range(4))  # each [blocks, half, 32]
    ql = np.concatenate([(q1 & 0xF) | ((q3 & 0xF) << 4), (q2 & 0xF) | ((q4 & 0xF) << 4)], axis=-1)
    qh = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)
    blocks = np.concatenate(
        [
            ql.reshape(-1, 128).astype(np.uint8),
            qh.reshape(-1, 64).astype(np.uint8),
            sc.view(np.uint8),
            d.reshape(-1, 1).view(np.uint8),
        ],
        axis=1,
    )
    return blocks.reshape(rows, cols // Q6_K_BLOCK * 210)


def quantize_q4_k(values: np.ndarray) -> np.ndarray:
    """`values [rows, cols]` (cols a multiple of 256) as Q4_K bytes `[rows, cols / 256 * 144]`:
    each sub-block of 32 `d sc q - dmin m` with q in 0..15, its range from its
    minimum (or 0, as m is never negative) to its maximum."""
    rows, cols = values.shape
    x = values.astype(np.float32).reshape(-1, 8, 32)  # [blocks, sub-blocks, 32]
    low = np.minimum(x.min(axis=-1), 0.0)
    step = (x.max(axis=-1) - low) / 15.0
    d = (step.max(axis=-1) / 63.0).astype(np.float16)
    dmin = ((-low).max(axis=-1) / 63.0).astype(np.float16)
    d32, dmin32 = d.astype(np.float32), dmin.astype(np.float32)
    sc = np.clip(np.round(step / np.where(d32 == 0, 1, d32)[:, None]), 0, 63).astype(np.int32)
    m = np.clip(np.round(-low / np.where(dmin32 == 0, 1, dmin32)[:, None]), 0, 63).astype(np.int32)
    scale = d32[:, None] * sc
    offset = dmin32[:, None] * m
    q = np.round((x + offset[..., None]) / np.where(scale == 0, 1, scale)[..., None])
    q = np.clip(q, 0, 15).astype(np.uint8)  # [blocks, 8, 32]
    packed = np.concatenate(
        [
            sc[:, :4] | ((sc[:, 4:] >> 4) << 6),
            m[:, :4] | ((m[:, 4:] >> 4) << 6),
            (sc[:, 4:] & 0xF) | ((m[:, 4:] & 0xF) << 4),
        ],
        axis=1,
    ).astype(np.uint8)
    qs = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(-1, 128)  # run r: sub-blocks 2r, 2r + 1
    blocks = np.concatenate(
        [d.reshape(-1, 1).view(np.uint8), dmin.reshape(-1, 1).view(np.uint8), packed, qs], axis=1
    )
    return blocks.reshape(rows, cols // Q4_K_BLOCK * 144)
