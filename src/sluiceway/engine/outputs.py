"""Messages the engine loop delivers to per-choice consumers."""

from __future__ import annotations

from typing import Literal

import attrs

FinishReason = Literal["stop", "length", "abort", "error"]


@attrs.frozen
class TokenLogprob:
    """One generated token's log-probability and its top alternatives (ids)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@attrs.frozen
class ChoiceDelta:
    """What one choice produced in one engine step.

    `text` is the newly decoded text (never a partial UTF-8 character, never text
    that may still turn into a stop string). `finish_reason` is set on the choice's
    last delta only; after it the channel is closed. `stop_reason` is the stop
    string or stop token id that ended the choice, when one did. `error` is set
    (with finish_reason "error") when the engine failed. Token counts are totals
    so far, for usage reporting. `embedding` is an embedding sequence's pooled
    hidden state (mean or last, not normalized), on its one and last delta.
    """

    token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    logprobs: tuple[TokenLogprob, ...] = ()
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_prompt_tokens: int = 0
    error: str | None = None
    embedding: tuple[float, ...] | None = None

    def then(self, later: ChoiceDelta) -> ChoiceDelta:
        """This delta followed by `later` (of the same choice) as one delta: tokens,
        text and logprobs joined; finish, stop, error and counts from `later`."""
        return attrs.evolve(
            later,
            token_ids=self.token_ids + later.token_ids,
            text=self.text + later.text,
            logprobs=self.logprobs + later.logprobs,
        )
