"""A Hugging Face directory's safetensors weights, read a tensor at a time.

One file or the shards its index names (`model.safetensors.index.json`), each
opened with `safetensors.safe_open` (memory-mapped); a tensor is read, in the
model's dtype, only where the runner indexes it.

Mixture-of-experts checkpoints keep each expert's projections as tensors of
their own (`mlp.experts.3.gate_proj.weight`; Mixtral's
`block_sparse_moe.experts.3.w1.weight`), where transformers, and the runner's
families, see one 3D tensor per projection (`mlp.experts.gate_up_proj`); an
`ExpertStack` stands for that tensor and reads one expert's parts at a time.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import attrs
import torch

from sluiceway.runner.checkpoint.errors import CheckpointError
from sluiceway.runner.checkpoint.lazy_tensor import LazyWeights
from sluiceway.runner.checkpoint.progress import LoadProgress

INDEX = "model.safetensors.index.json"


@attrs.define
class SafetensorsOptions:
    """The dtype every tensor is read as, and the progress to count it in."""

    dtype: torch.dtype
    progress: LoadProgress | None = None
    seen: set[str] = attrs.Factory(set)


@attrs.frozen(eq=False)
class SafetensorsTensor:
    handle: Any  # keeps its file mapped
    name: str
    shape: tuple[int, ...]
    dtype_name: str
    nbytes: int
    options: SafetensorsOptions

    @property
    def type_name(self) -> str:
        return self.dtype_name

    def __getitem__(self, index: Any) -> torch.Tensor:
        values = self.handle.get_slice(self.name)[index]
        options = self.options
        if self.name not in options.seen:
            options.seen.add(self.name)
            if options.progress is not None:
                options.progress.read(self.nbytes)
        return values.to(options.dtype)


_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of `directory`: those its index names, else every
    `*.safetensors`; `CheckpointError` where there are none or one is missing."""
    index = directory / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index}: weight_map unreadable: {exc}") from None
        files = [directory / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index}: weight_map names missing files: {', '.join(missing)}")
        return files
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory}: no *.safetensors weights (other formats are not read)")
    return files


def safetensors_weights(directory: Path, options: SafetensorsOptions) -> LazyWeights:
    """Every tensor of `directory`'s safetensors files by name, unread."""
    from safetensors import SafetensorError, safe_open

    tensors: dict[str, SafetensorsTensor] = {}
    for file in weight_files(directory):
        try:
            handle = safe_open(str(file), framework="pt")
            for name in handle.keys():
                part = handle.get_slice(name)
                shape = tuple(part.get_shape())
                dtype = part.get_dtype()
                count = 1
                for dim in shape:
                    count *= dim
                tensors[name] = SafetensorsTensor(
                    handle, name, shape, dtype, count * _ITEMSIZE.get(dtype, 2), options
                )
        except (SafetensorError, OSError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CheckpointError(f"{file}: not a readable safetensors file: {first}") from None
    return LazyWeights(_stack_experts(tensors))


@attrs.frozen(eq=False)
class ExpertStack:
    """Per-expert tensors seen as one `[experts, rows, cols]` tensor: expert e's
    rows are its `parts[e]` stacked (gate then up; or down alone)."""

    parts: tuple[tuple[SafetensorsTensor, ...], ...]

    @property
    def shape(self) -> tuple[int, ...]:
        first = self.parts[0]
        return (len(self.parts), sum(p.shape[0] for p in first), first[0].shape[1])

    @property
    def type_name(self) -> str:
        return self.parts[0][0].type_name

    def __getitem__(self, index: Any) -> torch.Tensor:
        index = index if isinstance(index, tuple) else (index,)
        if not index or not isinstance(index[0], int):
            raise IndexError("per-expert tensors are read one expert at a time")
        rows = torch.cat([part[(slice(None),)] for part in self.parts[index[0]]], dim=0)
        return rows[index[1:]] if len(index) > 1 else rows


# (layer, expert, projection) of a per-expert tensor, and which of transformers'
# stacked tensors each projection belongs to: (name, position in it).
_EXPERT = re.compile(
    r"model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\."
    r"(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight"
)
_STACKED = {
    "gate_proj": ("gate_up_proj", 0),
    "w1": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
    "w3": ("gate_up_proj", 1),
    "down_proj": ("down_proj", 0),
    "w2": ("down_proj", 0),
}
_ROUTER = re.compile(r"model\.layers\.(\d+)\.block_sparse_moe\.gate\.weight")


def _stack_experts(tensors: dict[str, SafetensorsTensor]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    found: dict[tuple[str, str], dict[int, dict[int, SafetensorsTensor]]] = defaultdict(
        lambda: defaultdict(dict)
    )
    for name, tensor in tensors.items():
        match = _EXPERT.fullmatch(name)
        if match is None:
            router = _ROUTER.fullmatch(name)
            key = f"model.layers.{router.group(1)}.mlp.gate.weight" if router else name
            out[key] = tensor
            continue
        layer, expert, projection = match.groups()
        stacked, position = _STACKED[projection]
        found[(layer, stacked)][int(expert)][position] = tensor
    for (layer, stacked), experts in found.items():
        parts = tuple(
            tuple(experts[e][p] for p in sorted(experts[e])) for e in range(len(experts))
        )
        out[f"model.layers.{layer}.mlp.experts.{stacked}"] = ExpertStack(parts)
    return out
