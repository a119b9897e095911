"""Numbers with the ranges the server accepts, written once as types.

A request type's field says its range in its annotation; the server's decoder
(msgspec) enforces it and the OpenAPI document states it, from that one place.
`Annotated` metadata is invisible to type checkers: they see `int` or `float`.

An integer field also takes an integral JSON float (`4.0`): JSON Schema counts
it as an integer, and clients that compute numbers in floating point send it.
Use `as_int` on such a value.
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

MAX_N = 128
MAX_LOGPROBS = 20
MAX_STOP = 64
MAX_PROMPTS = 1024

_WHOLE = Meta(multiple_of=1)

Count = Annotated[int, Meta(ge=1)] | Annotated[float, Meta(ge=1), _WHOLE]
"""At least 1: max_tokens."""

NonNegative = Annotated[int, Meta(ge=0)] | Annotated[float, Meta(ge=0), _WHOLE]
"""At least 0: min_tokens."""

ChoicesN = Annotated[int, Meta(ge=1, le=MAX_N)] | Annotated[float, Meta(ge=1, le=MAX_N), _WHOLE]
"""Choices per prompt: n."""

TopK = Annotated[int, Meta(ge=-1)] | Annotated[float, Meta(ge=-1), _WHOLE]
"""-1 or 0 disables top-k."""

LogprobCount = (
    Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)]
    | Annotated[float, Meta(ge=0, le=MAX_LOGPROBS), _WHOLE]
)
"""Alternatives reported per token."""

TokenId = Annotated[int, Meta(ge=0)]
"""A token id; the upper bound is the served model's vocabulary, checked by the server."""

Temperature = Annotated[float, Meta(ge=0, le=2)]
Probability = Annotated[float, Meta(ge=0, le=1)]
TopP = Annotated[float, Meta(gt=0, le=1)]
Penalty = Annotated[float, Meta(ge=-2, le=2)]
RepetitionPenalty = Annotated[float, Meta(gt=0)]
Bias = Annotated[float, Meta(ge=-100, le=100)]
StopString = Annotated[str, Meta(min_length=1)]


def as_int(value: int | float | None) -> int | None:
    """An integer field's value as an int (the decoder has checked it is whole)."""
    return None if value is None else int(value)
