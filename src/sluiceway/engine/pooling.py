"""Prefill-only sequences that end in an embedding instead of a sampled token.

An embedding request enters the engine like a prompt: it is scheduled, chunked,
preempted and batched with everything else, and its keys and values fill the
KV cache (and the prefix cache) as any prompt's do. Its chunks ask the runner
for the final-normed hidden states (`ScheduledChunk.pooling`) instead of a
sample, and when its last chunk has run it finishes with the pooled vector.
"""

from __future__ import annotations

from typing import Literal

import attrs

Pooling = Literal["mean", "last"]
"""How a sequence's hidden states become one vector: their mean over every
prompt token, or the last token's."""


@attrs.frozen
class PooledHidden:
    """A runner's answer for one pooling chunk: for "mean", the sum of the chunk's
    final-normed hidden states (the engine adds the chunks up and divides); for
    "last", the chunk's last row."""

    seq_id: int
    values: tuple[float, ...]


@attrs.frozen
class PoolingSpec:
    """What a model's embeddings are: how they are pooled, their native width,
    and which shorter widths (`dimensions`) keep their meaning when cut to them.

    `matryoshka_dimensions` None: only the native width; an empty tuple: any width
    up to it (a Matryoshka model with no listed sizes); else the listed widths.
    """

    pooling: Pooling
    hidden_size: int
    matryoshka_dimensions: tuple[int, ...] | None = None

    def allows_dimensions(self, dimensions: int) -> bool:
        if dimensions == self.hidden_size:
            return True
        if self.matryoshka_dimensions is None:
            return False
        if not self.matryoshka_dimensions:
            return 0 < dimensions < self.hidden_size
        return dimensions in self.matryoshka_dimensions
