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


class StackedAdapters:
    """The pairs of `adapters` stacked by slot (an adapter's index in the tuple),
    one `(A [S, R, in], B [S, out, R])` a fused linear, R the largest of the
    pairs' (a fused linear's pair is its parts' side by side: q, k and v make
    three times the rank), the others padded with zeros, and an adapter that
    does not target the linear all zeros. Each linear's stack is built the
    first time a step asks for it."""

    def __init__(self, adapters: tuple[LoraAdapter, ...]) -> None:
        self.adapters = adapters
        self._stacks: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor] | None] = {}

    def holds(self, adapters: Sequence[LoraAdapter]) -> bool:
        """Whether these are the stacked adapters, in slot order (the same objects)."""
        return len(adapters) == len(self.adapters) and all(
            a is b for a, b in zip(adapters, self.adapters, strict=True)
        )

    def pair(self, layer: int, linear: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The stacks of fused linear `linear` of layer `layer`; None when no
        adapter targets it."""
        key = (layer, linear)
        if key not in self._stacks:
            pairs = [a.pairs.get(key) for a in self.adapters]
            found = next((p for p in pairs if p is not None), None)
            if found is None:
                self._stacks[key] = None
            else:
                out, inp = found.b.shape[0], found.a.shape[1]
                rank = max(p.a.shape[0] for p in pairs if p is not None)
                a = found.a.new_zeros(len(pairs), rank, inp)
                b = found.a.new_zeros(len(pairs), out, rank)
                for s, p in enumerate(pairs):
                    if p is not None:
                        a[s, : p.a.shape[0]] = p.a
                        b[s, :, : p.a.shape[0]] = p.b
                self._stacks[key] = (a, b)
        return self._stacks[key]


@attrs.frozen
class LoraRows:
    """Which rows of a step's `[T, ...]` batch each adapter serves (`index` None:
    every row); rows of no group are the base model's. With `stacked`, the
    deltas run through the triton kernel instead, `slots` giving each row's
    adapter slot (-1: the base model)."""

    groups: tuple[tuple[LoraAdapter, torch.Tensor | None], ...]
    stacked: StackedAdapters | None = None
    slots: torch.Tensor | None = None

    @classmethod
    def stacked_rows(
        cls,
        stacked: StackedAdapters,
        row_adapters: Sequence[LoraAdapter | None],
        row_counts: Sequence[int],
        device,
    ) -> LoraRows:
        """The rows of a step for the triton kernel: chunk k's `row_counts[k]` rows
        served by `row_adapters[k]`, one of `stacked`'s adapters or None."""
        slot_of = {id(a): s for s, a in enumerate(stacked.adapters)}
        slots: list[int] = []
        for adapter, count in zip(row_adapters, row_counts, strict=True):
            slots += [-1 if adapter is None else slot_of[id(adapter)]] * count
        return cls((), stacked, torch.tensor(slots, dtype=torch.int32, device=device))

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
        if self.stacked is not None:
            from sluiceway.runner.kernels.lora_delta import lora_delta

            stacks = self.stacked.pair(layer, linear)
            if stacks is None:
                return y
            assert self.slots is not None
            return lora_delta(y, x.contiguous(), stacks[0], stacks[1], self.slots)
        for adapter, index in self.groups:
            pair = adapter.pairs.get((layer, linear))
            if pair is None:
                continue
            if index is None:
                y.add_((x @ pair.a.T) @ pair.b.T)
            else:
                y.index_add_(0, index, (x.index_select(0, index) @ pair.a.T) @ pair.b.T)
        return y
