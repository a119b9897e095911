"""The paged KV cache: the memory layout every attention backend reads and writes.

The layout is fixed (the triton kernels in `runner/kernels/` are written against it):
per layer one key tensor and one value tensor, each contiguous with shape
`[num_blocks, block_size, num_kv_heads, head_dim]`. Token position `pos` of a
sequence lives in slot `block_table[pos // block_size] * block_size + pos % block_size`,
i.e. row `slot` of the `[num_blocks * block_size, num_kv_heads, head_dim]` view.

A cache stores its rows in a float dtype, or quantized (`KVCacheFormat`): int8
or fp8 (e4m3) codes, one byte an element, and beside them one float32 scale per
slot and KV head (`[num_blocks, block_size, num_kv_heads]`), the row's largest
magnitude over the largest code. A row is quantized once, when it is written,
and never again: a scale per row rather than per block lets a block fill a
token at a time without requantizing what it holds. At head_dim 64 such a cache
takes 68 bytes a row against bfloat16's 128, so about 1.9 times the tokens fit
the same memory.
"""

from __future__ import annotations

from typing import get_args

import attrs
import torch

from sluiceway.config import KVCacheDType
from sluiceway.runner.native.paged_decode import store_quantized_rows

KV_CACHE_DTYPES: tuple[str, ...] = get_args(KVCacheDType)

_FLOATS = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# Quantized formats: (the code tensors' dtype, the largest code). fp8 codes are
# float8_e4m3fn bit patterns held as uint8: torch's CPU index ops (index_copy_)
# do not take float8 tensors.
_CODES = {"int8": (torch.int8, 127.0), "fp8": (torch.uint8, 448.0)}
QUANTIZED_KV_CACHE_DTYPES: tuple[str, ...] = tuple(_CODES)


@attrs.frozen
class KVCacheFormat:
    """How a cache stores its rows: `name` (a `KVCacheDType` other than "auto"),
    the dtype of its tensors (`storage`), and the dtype reads are returned in
    (`compute`, the model's)."""

    name: str
    storage: torch.dtype
    compute: torch.dtype

    @property
    def quantized(self) -> bool:
        """Whether rows are stored as codes with a scale per slot and KV head."""
        return self.name in _CODES

    @property
    def element_bytes(self) -> int:
        return torch.empty((), dtype=self.storage).element_size()

    def row_bytes(self, head_dim: int) -> int:
        """Bytes one slot of one KV head takes, its scale included."""
        return head_dim * self.element_bytes + (4 if self.quantized else 0)


def kv_cache_format(name: str, model_dtype: torch.dtype) -> KVCacheFormat:
    """The format `--kv-cache-dtype name` means for a model computing in
    `model_dtype`: "auto" stores the model's dtype; ValueError for another name."""
    if name == "auto":
        return KVCacheFormat(str(model_dtype).removeprefix("torch."), model_dtype, model_dtype)
    if name in _FLOATS:
        return KVCacheFormat(name, _FLOATS[name], model_dtype)
    if name in _CODES:
        return KVCacheFormat(name, _CODES[name][0], model_dtype)
    raise ValueError(f"unknown KV cache dtype {name!r}: one of {', '.join(KV_CACHE_DTYPES)}")


def quantize_rows(
    rows: torch.Tensor, name: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` (`[..., D]`) as codes of format `name` ("int8" or "fp8") and one
    float32 scale per row (`[...]`): `code * scale` approximates the row, the
    row's largest magnitude maps to the largest code, an all-zero row has scale 0."""
    codes_dtype, top = _CODES[name]
    x = rows.to(torch.float32)
    scale = x.abs().amax(dim=-1) / top
    # A zero row divides by 1 instead of 0 (its codes are 0 either way).
    scaled = x / torch.where(scale > 0, scale, 1.0).unsqueeze(-1)
    if name == "int8":
        codes = scaled.round_().clamp_(-top, top).to(codes_dtype)
    else:
        codes = scaled.to(torch.float8_e4m3fn).view(codes_dtype)
    return codes, scale


def dequantize_rows(
    codes: torch.Tensor, scales: torch.Tensor, name: str, dtype: torch.dtype
) -> torch.Tensor:
    """The values `codes` (`[..., D]`, format `name`) with `scales` (`[...]`)
    stand for, in `dtype`; products are taken in float32, then rounded once."""
    values = codes.view(torch.float8_e4m3fn) if name == "fp8" else codes
    return (values.to(torch.float32) * scales.unsqueeze(-1)).to(dtype)


def kv_cache_bytes_per_block(
    *,
    num_layers: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype | None = None,
    format: KVCacheFormat | None = None,
) -> int:
    """Bytes one block costs across all layers, keys and values together (scales
    included), for a cache of `format`, or of plain `dtype`."""
    if format is None:
        if dtype is None:
            raise ValueError("give dtype or format")
        format = kv_cache_format("auto", dtype)
    return 2 * num_layers * block_size * num_kv_heads * format.row_bytes(head_dim)


def num_blocks_for_budget(budget_bytes: int, bytes_per_block: int) -> int:
    """How many whole blocks fit in `budget_bytes`; raises ValueError when not even one does."""
    blocks = int(budget_bytes) // bytes_per_block
    if blocks < 1:
        raise ValueError(
            f"KV cache budget of {budget_bytes} bytes holds no block ({bytes_per_block} bytes each)"
        )
    return blocks


@attrs.define
class KVCache:
    """Key and value tensors for every layer, allocated once and zero-filled; for
    a quantized `format` the tensors hold codes and `key_scales`/`value_scales`
    (`[num_blocks, block_size, num_kv_heads]` float32 per layer) their scales.

    Blocks carry no ownership here: the engine's block manager decides which
    sequence uses which block; the runner only writes and reads the slots named in
    each step's metadata.
    """

    key_caches: list[torch.Tensor]
    value_caches: list[torch.Tensor]
    block_size: int
    format: KVCacheFormat = attrs.field(default=None)
    key_scales: list[torch.Tensor] | None = None
    value_scales: list[torch.Tensor] | None = None

    def __attrs_post_init__(self) -> None:
        if self.format is None:  # a float cache given as its tensors
            self.format = kv_cache_format("auto", self.key_caches[0].dtype)
        if self.format.quantized and (self.key_scales is None or self.value_scales is None):
            raise ValueError(f"a {self.format.name} KV cache needs its scales")

    @classmethod
    def allocate(
        cls,
        *,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        format: KVCacheFormat | None = None,
    ) -> KVCache:
        """`format` None stores `dtype`; else `format` (whose `compute` reads return)."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be at least 1")
        format = format or kv_cache_format("auto", dtype)
        shape = (num_blocks, block_size, num_kv_heads, head_dim)

        def tensors(shape: tuple[int, ...], dtype: torch.dtype) -> list[torch.Tensor]:
            return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

        scales = format.quantized
        return cls(
            key_caches=tensors(shape, format.storage),
            value_caches=tensors(shape, format.storage),
            block_size=block_size,
            format=format,
            key_scales=tensors(shape[:3], torch.float32) if scales else None,
            value_scales=tensors(shape[:3], torch.float32) if scales else None,
        )

    @property
    def num_blocks(self) -> int:
        return self.key_caches[0].shape[0]

    @property
    def num_layers(self) -> int:
        return len(self.key_caches)

    @property
    def stores_compute_dtype(self) -> bool:
        """Whether rows are stored exactly as the model computes them (no
        quantization, no conversion): fused kernels that write or read the cache
        as plain tensors of the model's dtype serve only such a cache."""
        return self.format.storage == self.format.compute

    def flat_views(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's caches as `[num_slots, num_kv_heads, head_dim]` views (no copy)."""
        k, v = self.key_caches[layer], self.value_caches[layer]
        return k.view(-1, k.shape[2], k.shape[3]), v.view(-1, v.shape[2], v.shape[3])

    def write(
        self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Store `k`, `v` (`[T, num_kv_heads, head_dim]`) at `slot_mapping` (`[T]` int64)."""
        k_flat, v_flat = self.flat_views(layer)
        if not self.format.quantized:
            k_flat.index_copy_(0, slot_mapping, k.to(k_flat.dtype))
            v_flat.index_copy_(0, slot_mapping, v.to(v_flat.dtype))
            return
        assert self.key_scales is not None and self.value_scales is not None
        name = self.format.name
        for caches, scales, rows in (
            (self.key_caches, self.key_scales, k),
            (self.value_caches, self.value_scales, v),
        ):
            # The C store does in one pass what the torch ops below take a dozen
            # calls for, per layer per step.
            if store_quantized_rows(rows, slot_mapping, caches[layer], scales[layer], name):
                continue
            codes, scale = quantize_rows(rows, name)
            flat = caches[layer].view(-1, *caches[layer].shape[2:])
            flat.index_copy_(0, slot_mapping, codes)
            scales[layer].view(-1, scales[layer].shape[2]).index_copy_(0, slot_mapping, scale)

    def gather(self, layer: int, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Whole blocks `blocks` (`[B, nb]` int64) of the layer's keys and values,
        each `[B, nb * block_size, KVH, D]` in the compute dtype (dequantized for a
        quantized cache). Copying whole blocks with index_select is several times
        faster on CPU than indexing single slots."""
        b, nb = blocks.shape
        flat = blocks.reshape(-1)
        out = []
        for caches, scales in (
            (self.key_caches, self.key_scales),
            (self.value_caches, self.value_scales),
        ):
            cache = caches[layer]
            rows = cache.index_select(0, flat)
            if scales is not None:
                rows = dequantize_rows(
                    rows, scales[layer].index_select(0, flat), self.format.name, self.format.compute
                )
            elif rows.dtype != self.format.compute:
                rows = rows.to(self.format.compute)
            out.append(rows.view(b, nb * cache.shape[1], *cache.shape[2:]))
        return out[0], out[1]
