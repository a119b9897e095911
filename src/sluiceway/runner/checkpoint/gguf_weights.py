"""A GGUF file's weights under transformers' names, read a tensor at a time.

`gguf_weights` maps each tensor the runner reads to a `GGUFTensor`, which
dequantizes only the rows it is indexed for, into the model's dtype, undoing
what llama.cpp's converter changed (`tensor_names`). `Int4Blocks` of a Q4_0,
Q4_1 or Q4_K tensor come out the same way, codes and scales as stored, for the layers
served on int4 from the stored blocks (`stored_int4`).
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
import torch
from gguf import GGMLQuantizationType

from sluiceway.runner.checkpoint.block_codes import (
    INT4_BLOCK_TYPES,
    ROW_PACKED_INT4,
    Int4Blocks,
    int4_blocks,
)
from sluiceway.runner.checkpoint.gguf_file import GGUFFile, StoredTensor
from sluiceway.runner.checkpoint.lazy_tensor import LazyWeights, row_range
from sluiceway.runner.checkpoint.progress import LoadProgress
from sluiceway.runner.checkpoint.tensor_names import (
    GATE_UP_EXPERTS,
    GATE_UP_EXPERTS_HF,
    Transform,
    hf_name,
    transform,
    unpermute_order,
)
from sluiceway.runner.checkpoint.tensor_values import read_rows


@attrs.define
class ReadOptions:
    """What every tensor of one load is read as: `dtype`."""

    dtype: torch.dtype
    progress: LoadProgress | None = None
    seen: set[str] = attrs.Factory(set)


@attrs.frozen(eq=False)
class GGUFTensor:
    """One stored tensor as transformers names it (`shape` in torch order)."""

    file: GGUFFile
    stored: StoredTensor
    transform: Transform
    heads: int
    options: ReadOptions

    @property
    def shape(self) -> tuple[int, ...]:
        return self.stored.shape

    @property
    def type_name(self) -> str:
        return self.stored.type_name

    def __getitem__(self, index: Any) -> torch.Tensor:
        first, last, rest = self._rows(index)
        if self.transform is Transform.MINUS_ONE:
            values = read_rows(self.stored, torch.float32, first, last)
            values = (values - 1.0).to(self.options.dtype)
        else:
            values = read_rows(self.stored, self.options.dtype, first, last)
        self._count(first, last)
        return self._finish(values, index, rest)

    def int4_blocks(self, index: Any) -> Int4Blocks:
        """The stored codes, scales and offsets of the rows `index` selects (the
        tensor must be Q4_0, Q4_1 or Q4_K)."""
        if self.stored.ggml_type not in INT4_BLOCK_TYPES:
            raise ValueError(f"{self.stored.name} is {self.type_name}, not a 4-bit block type")
        first, last, rest = row_range(self.shape, index)
        if rest and rest != (slice(None),):
            raise IndexError("4-bit blocks are read by whole rows")
        if self.transform in (Transform.UNPERMUTE_Q, Transform.UNPERMUTE_K):
            rows = self.shape[0]
            whole = int4_blocks(self.stored.ggml_type, self.stored.blocks(), rows)
            self._count(0, rows)
            ordered = self.int4_order(whole)
            return ordered.rows(slice(first, last))
        data = self.stored.blocks()[first:last]
        blocks = int4_blocks(self.stored.ggml_type, data, last - first)
        self._count(first, last)
        return blocks

    def int4_rows(self, index: Any) -> tuple[np.ndarray, np.ndarray]:
        """Where the rows `index` selects lie in the mapped file, in transformers'
        row order: `(addresses, kinds)`, int64 and uint8 (0 Q4_0, 1 Q4_1, 2 Q4_K:
        `ROW_PACKED_INT4`) per row, for `int8_dot.pack_q4_rows`, which reads them
        while the file stays open. `read(index)` once they are read."""
        if self.stored.ggml_type not in ROW_PACKED_INT4:
            raise ValueError(f"{self.stored.name} is {self.type_name}, not a 4-bit block type")
        first, last, rest = row_range(self.shape, index)
        if rest and rest != (slice(None),):
            raise IndexError("4-bit blocks are read by whole rows")
        blocks = self.stored.blocks()
        base = blocks.__array_interface__["data"][0]
        order = np.arange(blocks.shape[0], dtype=np.int64)
        if self.transform in (Transform.UNPERMUTE_Q, Transform.UNPERMUTE_K):
            order = np.asarray(unpermute_order(blocks.shape[0], self.heads), dtype=np.int64)
        addresses = base + order[first:last] * blocks.shape[1]
        kind = ROW_PACKED_INT4[self.stored.ggml_type]
        return addresses, np.full(last - first, kind, dtype=np.uint8)

    def q8_0_blocks(self, index: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored codes (int8 `[rows, cols]`) and block scales (float16 `[rows,
        cols / 32]`) of the rows `index` selects, in transformers' row order (the
        tensor must be Q8_0: w = q * d per block of 32), copied out of the mapping."""
        if self.stored.ggml_type != GGMLQuantizationType.Q8_0:
            raise ValueError(f"{self.stored.name} is {self.type_name}, not Q8_0")
        first, last, rest = row_range(self.shape, index)
        if rest and rest != (slice(None),):
            raise IndexError("Q8_0 blocks are read by whole rows")
        blocks = self.stored.blocks()
        if self.transform in (Transform.UNPERMUTE_Q, Transform.UNPERMUTE_K):
            order = np.asarray(unpermute_order(blocks.shape[0], self.heads), dtype=np.int64)
            rows = blocks[order[first:last]]
        else:
            rows = blocks[first:last]
        raw = np.ascontiguousarray(rows).reshape(last - first, -1, 34)
        scales = torch.from_numpy(np.ascontiguousarray(raw[..., :2]).view(np.float16)[..., 0])
        codes = torch.from_numpy(np.ascontiguousarray(raw[..., 2:]).view(np.int8))
        self.read(index)
        return codes.reshape(last - first, -1), scales

    def read(self, index: Any) -> None:
        """Count the rows `index` selects as read (progress; the file's pages of a
        tensor read whole are let go)."""
        if self.transform in (Transform.UNPERMUTE_Q, Transform.UNPERMUTE_K):
            self._count(0, self.shape[0])
        else:
            self._count(*row_range(self.shape, index)[:2])

    def _rows(self, index: Any) -> tuple[int, int, tuple[Any, ...]]:
        if self.transform in (Transform.UNPERMUTE_Q, Transform.UNPERMUTE_K):
            index = index if isinstance(index, tuple) else (index,)
            rows = index[0] if index and isinstance(index[0], slice) else slice(None)
            if rows != slice(None):
                # Rows of the unpermuted order come from all over the stored tensor:
                # read it whole (q and k are small), take the rows after.
                return 0, self.shape[0], (slice(None),)
        return row_range(self.shape, index)

    def _finish(self, values: torch.Tensor, index: Any, rest: tuple[Any, ...]) -> torch.Tensor:
        if self.transform in (Transform.UNPERMUTE_Q, Transform.UNPERMUTE_K):
            values = values[unpermute_order(values.shape[0], self.heads)]
            return values[index if isinstance(index, tuple) else (index,)]
        if len(self.shape) == 1:
            return values.reshape(-1)[rest if rest else slice(None)]
        whole_3d = len(self.shape) == 3 and values.shape[0] == self.shape[0] * self.shape[1]
        if whole_3d:
            return values.reshape(self.shape)[index if isinstance(index, tuple) else (index,)]
        return values[(slice(None), *rest)] if rest else values

    def int4_order(self, blocks: Int4Blocks) -> Int4Blocks:
        """`blocks` of the whole tensor in transformers' row order."""
        if self.transform not in (Transform.UNPERMUTE_Q, Transform.UNPERMUTE_K):
            return blocks
        return blocks.rows(unpermute_order(blocks.shape[0], self.heads))

    def _count(self, first: int, last: int) -> None:
        options = self.options
        if self.stored.name in options.seen:
            return
        options.seen.add(self.stored.name)
        if options.progress is not None:
            options.progress.read(self.stored.nbytes)
        rows = self.stored.n_elements // self.shape[-1]
        if first == 0 and last == rows:
            self.file.release(self.stored)


@attrs.frozen(eq=False)
class StackedExperts:
    """Experts' gate and up, stored as two `[E, I, hidden]` tensors, seen as
    transformers' one `[E, 2I, hidden]` (`mlp.experts.gate_up_proj`)."""

    gate: GGUFTensor
    up: GGUFTensor

    @property
    def shape(self) -> tuple[int, ...]:
        experts, inter, hidden = self.gate.shape
        return (experts, 2 * inter, hidden)

    @property
    def type_name(self) -> str:
        return self.gate.type_name

    def _parts(self, index: Any) -> list[tuple[GGUFTensor, Any]]:
        index = index if isinstance(index, tuple) else (index,)
        if not index or not isinstance(index[0], int):
            raise IndexError("stacked experts are read one expert at a time")
        expert, rest = index[0], index[1:]
        inter = self.gate.shape[1]
        rows = rest[0] if rest and isinstance(rest[0], slice) else slice(None)
        first, last, _ = rows.indices(2 * inter)
        cols = rest[1:] if rest and isinstance(rest[0], slice) else rest
        parts = []
        if first < inter:
            parts.append((self.gate, (expert, slice(first, min(last, inter)), *cols)))
        if last > inter:
            parts.append((self.up, (expert, slice(max(first, inter) - inter, last - inter), *cols)))
        return parts

    def __getitem__(self, index: Any) -> torch.Tensor:
        return torch.cat([part[i] for part, i in self._parts(index)], dim=0)

    def int4_blocks(self, index: Any) -> Int4Blocks:
        return Int4Blocks.stacked([part.int4_blocks(i) for part, i in self._parts(index)])

    def q8_0_blocks(self, index: Any) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [part.q8_0_blocks(i) for part, i in self._parts(index)]
        return torch.cat([c for c, _ in parts]), torch.cat([d for _, d in parts])

    def int4_rows(self, index: Any) -> tuple[np.ndarray, np.ndarray]:
        parts = [part.int4_rows(i) for part, i in self._parts(index)]
        return np.concatenate([a for a, _ in parts]), np.concatenate([k for _, k in parts])

    def read(self, index: Any) -> None:
        for part, i in self._parts(index):
            part.read(i)


def gguf_weights(file: GGUFFile, config: Any, options: ReadOptions) -> LazyWeights:
    """The weights of `file` under transformers' names, for `config` (its head
    counts undo the q/k permutation)."""
    arch = file.architecture
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    tensors: dict[str, Any] = {}
    stacked: dict[str, dict[str, GGUFTensor]] = {}
    for name, stored in file.tensors.items():
        kind = transform(arch, name)
        tensor = GGUFTensor(
            file, stored, kind, kv_heads if kind is Transform.UNPERMUTE_K else heads, options
        )
        layer, _, rest = name.removeprefix("blk.").partition(".")
        if name.startswith("blk.") and rest in GATE_UP_EXPERTS:
            stacked.setdefault(layer, {})[rest] = tensor
            continue
        target = hf_name(arch, name)
        if target is not None:
            tensors[target] = tensor
    for layer, pair in stacked.items():
        if len(pair) == 2:
            gate, up = (pair[n] for n in GATE_UP_EXPERTS)
            tensors[f"model.layers.{layer}.{GATE_UP_EXPERTS_HF}"] = StackedExperts(gate, up)
    return LazyWeights(tensors)
