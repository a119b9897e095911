"""The contract between the engine (pure Python) and a model runner (torch).

The engine loop hands a `StepBatch` to `ModelRunner.step` in a worker thread and
gets back one `SampledToken` per chunk that asked for a sample. A runner keeps no
per-sequence state besides the KV cache contents the block tables point to, so an
abort or a preemption needs no message to the runner.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import attrs

from sluiceway.engine.constraint import TokenMasks
from sluiceway.engine.pooling import PooledHidden, Pooling, PoolingSpec
from sluiceway.engine.sampling_params import SamplingParams


@attrs.frozen
class ScheduledChunk:
    """Part of one sequence to run through the model in this step.

    `token_ids` are the tokens at positions `start_pos .. start_pos + len(token_ids) - 1`;
    their keys and values go into the KV cache slots given by `block_table`
    (slot = block_table[pos // block_size] * block_size + pos % block_size), and
    attention for them reads positions `0 .. pos` through the same table.
    `block_table` covers at least every position up to the chunk's last one.

    When `sample` is true this chunk ends the sequence's known tokens and the runner
    samples the next one from the last position's logits using `params`:
    `step_seed` seeds that single draw (so a seeded choice draws the same token
    whatever else is in the batch), `suppressed_token_ids` get -inf (EOS while
    `min_tokens` is unmet), and `prompt_token_ids` / `output_token_ids` feed the
    repetition, presence and frequency penalties.

    `pooling` is set on the chunks of an embedding sequence (which never samples):
    the runner then returns the chunk's final-normed hidden states pooled as it
    says (`PooledHidden`).
    """

    seq_id: int
    token_ids: Sequence[int]
    start_pos: int
    block_table: Sequence[int]
    sample: bool
    params: SamplingParams
    step_seed: int = 0
    suppressed_token_ids: tuple[int, ...] = ()
    prompt_token_ids: Sequence[int] = ()
    output_token_ids: Sequence[int] = ()
    pooling: Pooling | None = None

    @property
    def lora_id(self) -> int:
        """The LoRA adapter every row of this chunk runs through (0: the base model):
        a step's per-row adapter index is its chunks' ids over their token counts."""
        return self.params.lora_id


@attrs.frozen
class StepBatch:
    """Everything one model step computes; chunks are in scheduling order.

    `token_masks`, when set, are being filled for the sampled rows whose choices
    follow a grammar (`TokenMasks.rows` count sampled chunks only): the runner
    waits for them after its forward pass and allows only their tokens there.
    """

    chunks: tuple[ScheduledChunk, ...]
    token_masks: TokenMasks | None = None

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)


@attrs.frozen
class SampledToken:
    """The token drawn for one chunk, with the model's log-probabilities.

    `logprob` is the sampled token's log-probability under the model's raw
    distribution (log-softmax of the logits before temperature, top-k/p and
    penalties); `top_logprobs` holds the `params.logprobs` most likely tokens under
    that same distribution, most likely first (empty when `params.logprobs` is None).
    """

    seq_id: int
    token_id: int
    logprob: float
    top_logprobs: tuple[tuple[int, float], ...] = ()


class ModelRunner(Protocol):
    """What the engine needs from a model. `step` is called from one worker thread
    at a time and must not touch engine state; it returns the samples in the order
    of the chunks that had `sample=True`. It may raise; the engine then fails every
    open request and reports itself unhealthy."""

    @property
    def block_size(self) -> int: ...

    @property
    def num_blocks(self) -> int: ...

    def step(self, batch: StepBatch) -> list[SampledToken]: ...


class PoolingModelRunner(ModelRunner, Protocol):
    """A runner that also serves embeddings: `pooling` says how its model's are
    pooled, and `step_pooled` is `step` plus one `PooledHidden` per chunk with
    `pooling` set, in chunk order. The engine calls `step_pooled` only for steps
    that have such chunks."""

    @property
    def pooling(self) -> PoolingSpec: ...

    def step_pooled(self, batch: StepBatch) -> tuple[list[SampledToken], list[PooledHidden]]: ...
