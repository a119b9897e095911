"""The LoRA deltas of a mixed step: rows of several adapters and of the base model
in one token batch.

Each linear's delta is computed per adapter present in the step: its rows are
gathered, multiplied by its A and B (`[n, in] @ [in, R] @ [R, out]`) and added
back into the linear's output by index. Gathering every row's A and B by its
adapter index into one `bmm` instead (punica's shape) was slower on CPU in most
of the cases measured (`benchmarks/lora_mixed.py --kernels`; docs/benchmarks.md),
and its `[T, R, in]` copy of A grows with a prefill's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from sluiceway.runner.lora.adapter import LoraAdapter


@attrs.frozen
class LoraRows:
    """Which rows of a step's `[T, ...]` batch each adapter serves (`index` None:
    every row); rows of no group are the base model's."""

    groups: tuple[tuple[LoraAdapter, torch.Tensor | None], ...]

    @classmethod
    def of(
        cls, row_adapters: Sequence[LoraAdapter | None], row_counts: Sequence[int], device
    ) -> LoraRows | None:
        """The groups of a step whose k-th chunk has `row_counts[k]` rows served by
        `row_adapters[k]` (None: the base model); None when no row has an adapter."""
        rows: dict[int, tuple[LoraAdapter, list[int]]] = {}
        start = 0
        for adapter, count in zip(row_adapters, row_counts, strict=True):
            if adapter is not None:
                rows.setdefault(id(adapter), (adapter, []))[1].extend(range(start, start + count))
            start += count
        if not rows:
            return None
        total = start
        groups = tuple(
            (adapter, None if len(index) == total else torch.tensor(index, device=device))
            for adapter, index in rows.values()
        )
        return cls(groups)

    def add_delta(self, y: torch.Tensor, x: torch.Tensor, layer: int, linear: str) -> torch.Tensor:
        """`y` (the output of fused linear `linear` of layer `layer` on `x`, a fresh
        tensor) with each adapter's delta added to its rows, in place."""
        for adapter, index in self.groups:
            pair = adapter.pairs.get((layer, linear))
            if pair is None:
                continue
            if index is None:
                y.add_((x @ pair.a.T) @ pair.b.T)
            else:
                y.index_add_(0, index, (x.index_select(0, index) @ pair.a.T) @ pair.b.T)
        return y
