"""What the engine needs of constrained decoding, as protocols: the engine follows
each constrained choice with a matcher and asks for the next-token masks of a
step's constrained rows; `sluiceway.grammar` provides both (llguidance), tests may
provide fakes. Nothing here imports a grammar library.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol


class TokenMatcher(Protocol):
    """One choice's position in its grammar."""

    def accept_token(self, token_id: int) -> bool:
        """Advance past `token_id`; False if the grammar does not allow it."""
        ...

    def is_stopped(self) -> bool:
        """Only the end of the output may follow: the choice is complete."""
        ...

    def error(self) -> str | None: ...


class Grammar(Protocol):
    """A compiled constraint that a request's choices follow (`SamplingParams.grammar`)."""

    def new_matcher(self) -> TokenMatcher: ...


class TokenMasks(Protocol):
    """Next-token masks being filled for one step: `rows` are indices among the
    step's sampled rows; `wait()` returns an int32 bitmask `[len(rows), words]`
    (bit t % 32 of word t // 32 set where token t is allowed)."""

    rows: tuple[int, ...]
    fill_seconds: float  # set once filled: how long the fill took
    wait_seconds: float  # how long `wait` blocked the step

    def wait(self) -> Any: ...


MaskFiller = Callable[[Sequence[tuple[int, TokenMatcher]]], TokenMasks]
"""Starts filling the masks of `(row, matcher)` pairs; the matchers do not change
until the returned masks' `wait()` has returned."""


def default_mask_filler() -> MaskFiller:
    """llguidance's, imported only when a constrained choice first needs it."""
    from sluiceway.grammar.masks import start_fill

    return start_fill  # type: ignore[return-value]
