"""Token counts of a response."""

from __future__ import annotations

import attrs

from sluiceway.protocol._codec import Wire


@attrs.frozen
class PromptTokensDetails(Wire):
    cached_tokens: int = 0


@attrs.frozen
class CompletionTokensDetails(Wire):
    """Of the completion tokens, how many were a reasoning model's thinking."""

    reasoning_tokens: int = 0


@attrs.frozen
class Usage(Wire):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None

    wire_omit_none = frozenset({"prompt_tokens_details", "completion_tokens_details"})
