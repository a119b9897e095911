"""Log-probabilities in the chat format and in the legacy completions format."""

from __future__ import annotations

import attrs

from sluiceway.protocol._codec import Wire


@attrs.frozen
class TopLogprob(Wire):
    """One alternative token in the chat logprobs format."""

    token: str
    logprob: float
    bytes: list[int] | None = None


@attrs.frozen
class ChatTokenLogprob(Wire):
    """One generated token in the chat logprobs format."""

    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = attrs.field(factory=list)


@attrs.frozen
class ChatLogprobs(Wire):
    """``choice.logprobs`` of the chat API: ``{"content": [...], "refusal": null}``."""

    content: list[ChatTokenLogprob] | None = None
    refusal: list[ChatTokenLogprob] | None = None  # the refusal message's tokens


@attrs.frozen
class CompletionLogprobs(Wire):
    """``choice.logprobs`` of the legacy completions API (parallel lists)."""

    tokens: list[str] = attrs.field(factory=list)
    token_logprobs: list[float | None] = attrs.field(factory=list)
    top_logprobs: list[dict[str, float]] | None = None
    text_offset: list[int] = attrs.field(factory=list)
