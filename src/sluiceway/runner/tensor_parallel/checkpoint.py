"""A rank reads only its slices of a safetensors checkpoint.

Loading the whole model and slicing it would cost every rank the whole model's
host memory at once (N copies on one machine). A Hugging Face directory of
`.safetensors` files is memory-mapped instead, and `ShardPlan.shard` indexes each
weight for just the rows or columns its rank keeps. Anything else (a GGUF file,
the default model, `.bin` weights) is loaded whole through `load_model`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


class LazyWeight:
    """One checkpoint tensor, read from its file only where indexed."""

    def __init__(self, handle: Any, name: str) -> None:
        self._handle = handle  # keeps the file mapped
        self._name = name
        self.shape = tuple(handle.get_slice(name).get_shape())

    def __getitem__(self, index: Any) -> torch.Tensor:
        return self._handle.get_slice(self._name)[index]


def lazy_checkpoint(model: str | None) -> tuple[Any, dict[str, LazyWeight]] | None:
    """`(transformers config, weights by name, unread)` for a Hugging Face directory
    of safetensors files; None for any other model source."""
    if model is None:
        return None
    directory = Path(model).expanduser()
    files = sorted(directory.glob("*.safetensors")) if directory.is_dir() else []
    if not files:
        return None
    from safetensors import safe_open
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    weights: dict[str, LazyWeight] = {}
    for file in files:
        handle = safe_open(str(file), framework="pt")
        for name in handle.keys():
            weights[name] = LazyWeight(handle, name)
    return config, weights
