"""Checkpoint tensors that are read only where indexed.

The runner's families index a checkpoint tensor for a whole weight, one expert
of a 3D expert tensor, or some of its rows (`models.weights.WeightView`); a
`LazyTensor` reads just those rows from the file, in the model's dtype. A
mapping of them (`LazyWeights`) stands where a framework's state dict stood.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import torch


class LazyTensor(Protocol):
    """A tensor of `shape`, read from its file by `t[index]`: `index` an int (an
    expert), slices, or a tuple of them."""

    shape: tuple[int, ...]

    def __getitem__(self, index: Any) -> torch.Tensor: ...


def row_range(shape: tuple[int, ...], index: Any) -> tuple[int, int, tuple[Any, ...]]:
    """`(first, last, rest)`: the rows of the tensor seen as a matrix of its last
    dimension that `index` selects (a leading int picks an expert of a 3D tensor,
    then a slice of rows), and what of `index` is left for the columns."""
    index = index if isinstance(index, tuple) else (index,)
    if len(shape) == 1:
        return 0, 1, index
    rows = shape[-2]
    base = 0
    if len(shape) == 3:
        if not index or not isinstance(index[0], int):
            return 0, shape[0] * rows, index  # whole: rows of every expert
        base, index = index[0] * rows, index[1:]
    first, last = 0, rows
    if index and isinstance(index[0], slice):
        first, last, step = index[0].indices(rows)
        if step != 1:
            raise IndexError("a lazy checkpoint tensor reads contiguous rows only")
        index = index[1:]
    return base + first, base + last, index


class LazyWeights(Mapping[str, Any]):
    """Checkpoint tensors by transformers name, each a `LazyTensor`. Membership and
    iteration never read a tensor; `tensor(name)` reads one whole."""

    def __init__(self, tensors: Mapping[str, LazyTensor]) -> None:
        self._tensors = dict(tensors)

    def __getitem__(self, name: str) -> LazyTensor:
        return self._tensors[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def tensor(self, name: str) -> torch.Tensor:
        """Tensor `name`, read whole, in its full shape."""
        lazy = self._tensors[name]
        return lazy[(slice(None),)].reshape(lazy.shape)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor read whole (for references in tests and comparisons; the
        runner reads them one at a time)."""
        return {name: self.tensor(name) for name in self._tensors}
