"""One choice of one request as the engine tracks it (owned by the engine loop)."""

from __future__ import annotations

import enum
from collections.abc import Hashable

import attrs

from sluiceway.engine.constraint import TokenMatcher
from sluiceway.engine.detokenizer import IncrementalDetokenizer
from sluiceway.engine.outputs import FinishReason, TokenLogprob
from sluiceway.engine.pooling import Pooling
from sluiceway.engine.sampling_params import SamplingParams

_MASK64 = (1 << 64) - 1


def mix_seed(*parts: int) -> int:
    """Deterministically mix integers into one 63-bit seed (splitmix64 finaliser).

    Used so a choice's draw depends only on (request seed, choice index, output
    index): the same whatever shares the batch, and the same after a preemption
    recomputes the sequence.
    """
    x = 0x9E3779B97F4A7C15
    for part in parts:
        x = (x ^ (part & _MASK64)) & _MASK64
        x = (x + 0x9E3779B97F4A7C15) & _MASK64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
        x ^= x >> 31
    return x >> 1


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@attrs.define(eq=False)
class Sequence:
    """Token state of one choice.

    Invariants: `token_ids` is the prompt followed by the outputs;
    `num_computed_tokens` tokens have their keys/values in the blocks of
    `block_ids` (which cover at least that many positions); `block_hashes[i]` is
    the prefix hash of full block i (content-derived, so it survives preemption);
    the first `num_registered_blocks` blocks are offered to the prefix cache.
    `group` is who the sequence is scheduled fairly for: free sequence slots go
    first to the group running the fewest sequences (see `Scheduler`).
    `matcher` follows the output tokens through `params.grammar`; a preemption
    keeps the outputs (they are recomputed, not redrawn), so it keeps the matcher
    as it is.
    `pooling` marks an embedding sequence: it runs its prompt and no more, and
    `pooled_sum` adds up the pooled hidden states of its chunks so far (reset
    when a preemption makes it recompute them). A `background` sequence (a Batch
    API line) yields to every other in the scheduler.
    """

    seq_id: int
    request_id: int
    choice_index: int
    params: SamplingParams
    seed: int
    token_ids: list[int]
    num_prompt_tokens: int
    detokenizer: IncrementalDetokenizer
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_prompt_tokens: int = 0
    block_ids: list[int] = attrs.field(factory=list)
    block_hashes: list[int] = attrs.field(factory=list)
    num_registered_blocks: int = 0
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    pending_logprobs: list[TokenLogprob] = attrs.field(factory=list)
    group: Hashable = None
    matcher: TokenMatcher | None = None
    pooling: Pooling | None = None
    pooled_sum: list[float] | None = None
    background: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def reuses_cached_prefix(self) -> bool:
        """Whether admission may skip the prompt's cached blocks: not for an
        embedding, whose vector must depend on its own tokens alone (cached keys and
        values were computed in other batches, which half precision rounds
        differently) and, mean-pooled, needs every token's hidden state."""
        return self.pooling is None

    def next_step_seed(self) -> int:
        return mix_seed(self.seed, self.choice_index, self.num_output_tokens)
