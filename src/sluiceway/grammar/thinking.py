"""Constraints that start after a reasoning model's thinking.

A thinking model writes free text between its tags before the answer a grammar
(JSON Schema, regex, tools) describes, as vLLM and SGLang let it: a
`ThinkingGrammar` leaves the thinking unconstrained and hands each choice to the
answer's grammar once the closing tag's text has been generated. With a budget
(`max_reasoning_tokens`), the thinking's last allowed token is followed by the
closing tag, forced a token at a time, and the answer starts there.

When a grammar follows, the opening tag is forced too where the model is
expected to write it (a prompt that leaves the block `fresh`): the grammar
cannot tell in advance whether the output will think, and an answer that began
unconstrained could not be finished by the grammar.

The closing tag is found in the text of the tokens (the end tag is one special
token in Qwen3's vocabulary and several in others); text that shares the tag's
last token is not the grammar's to see, so it must be blank for the answer to
match (templates put newlines there).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from sluiceway.grammar.compiler import CompiledGrammar, GrammarMatcher
from sluiceway.reasoning import PromptState, ReasoningFormat

Forced = int
"""A mask source that allows one token only."""


class Stage(enum.Enum):
    OPENING = "opening"  # forcing the opening tag's tokens
    THINKING = "thinking"
    CLOSING = "closing"  # forcing the closing tag's tokens: the budget ran out
    ANSWER = "answer"


@attrs.frozen
class ThinkingTokens:
    """What a constraint needs of the tokenizer: the tags as token ids, and the
    text of one token (`piece`)."""

    format: ReasoningFormat
    start_ids: tuple[int, ...]
    closer_ids: tuple[int, ...]
    vocab_size: int
    piece: Callable[[int], str]

    @classmethod
    def from_tokenizer(
        cls, tokenizer: Any, fmt: ReasoningFormat, vocab_size: int
    ) -> ThinkingTokens:
        """The tags as `tokenizer` (a transformers tokenizer) encodes them."""

        def encode(text: str) -> tuple[int, ...]:
            return tuple(tokenizer.encode(text, add_special_tokens=False))

        def piece(token: int) -> str:
            return str(tokenizer.decode([token], skip_special_tokens=False))

        return cls(fmt, encode(fmt.start), encode(fmt.closer), vocab_size, piece)


class ThinkingGrammar:
    """A request's constraint: free thinking, then `answer` (None: free text).
    `budget`: thinking tokens before the closing tag is forced (None: no limit).
    Satisfies the engine's `Grammar`."""

    def __init__(
        self,
        tokens: ThinkingTokens,
        state: PromptState,
        answer: CompiledGrammar | None,
        budget: int | None = None,
    ) -> None:
        if budget is not None and budget < 0:
            raise ValueError("a thinking budget is a count of tokens, at least 0")
        self.tokens = tokens
        self.state = state
        self.answer = answer
        self.budget = budget

    def new_matcher(self) -> ThinkingMatcher:
        if self.state == "closed":
            stage = Stage.ANSWER
        elif self.state == "fresh" and not self.tokens.format.implicit_start:
            stage = Stage.OPENING
        else:
            stage = Stage.THINKING
        inner = self.answer.new_matcher() if self.answer is not None else None
        matcher = ThinkingMatcher(self.tokens, inner, self.budget, stage)
        matcher.settle()
        return matcher


@attrs.define
class ThinkingMatcher:
    """One choice's position: which stage, how far into a forced tag, and the
    answer's matcher. Used by one thread at a time, as `GrammarMatcher` is."""

    tokens: ThinkingTokens
    inner: GrammarMatcher | None
    budget: int | None
    stage: Stage
    thinking_tokens: int = 0
    _forced_at: int = 0
    _tail: str = ""
    _error: str | None = None

    @property
    def vocab_size(self) -> int:
        return self.tokens.vocab_size

    def mask_source(self) -> GrammarMatcher | Forced | None:
        """What decides the next token: the answer's matcher, one forced token, or
        nothing (any token may follow)."""
        if self.stage is Stage.OPENING:
            return self.tokens.start_ids[self._forced_at]
        if self.stage is Stage.CLOSING:
            return self.tokens.closer_ids[self._forced_at]
        if self.stage is Stage.ANSWER:
            return self.inner
        return None

    def accept_token(self, token_id: int) -> bool:
        """Advance past `token_id`; False (and `error()` says why) where a forced
        tag's token or the answer's grammar does not allow it."""
        if self._error is not None:
            return False
        if self.stage in (Stage.OPENING, Stage.CLOSING):
            forced = self.mask_source()
            if token_id != forced:
                self._error = f"token {token_id} where the thinking tag needs {forced}"
                return False
            self._forced_at += 1
            ids = self.tokens.start_ids if self.stage is Stage.OPENING else self.tokens.closer_ids
            if self._forced_at == len(ids):
                self._forced_at = 0
                self.stage = Stage.THINKING if self.stage is Stage.OPENING else Stage.ANSWER
            self.settle()
            return True
        if self.stage is Stage.THINKING:
            self.thinking_tokens += 1
            end = self.tokens.format.end
            self._tail = (self._tail + self.tokens.piece(token_id))[-(len(end) + 64) :]
            if end in self._tail:
                self.stage = Stage.ANSWER
            self.settle()
            return True
        return self.inner is None or self.inner.accept_token(token_id)

    def settle(self) -> None:
        """Move on where nothing is left to generate in the stage: an empty tag,
        a spent budget."""
        if self.stage is Stage.OPENING and not self.tokens.start_ids:
            self.stage = Stage.THINKING
        if (
            self.stage is Stage.THINKING
            and self.budget is not None
            and self.thinking_tokens >= self.budget
        ):
            self.stage = Stage.CLOSING if self.tokens.closer_ids else Stage.ANSWER

    def is_stopped(self) -> bool:
        return self.stage is Stage.ANSWER and self.inner is not None and self.inner.is_stopped()

    def error(self) -> str | None:
        if self._error is not None:
            return self._error
        return self.inner.error() if self.inner is not None else None


def mask_sources(
    rows: Sequence[tuple[int, Any]],
) -> list[tuple[int, GrammarMatcher | Forced | None]]:
    """Each row's mask source: a `ThinkingMatcher`'s current one, a plain
    matcher itself."""
    return [
        (row, matcher.mask_source() if isinstance(matcher, ThinkingMatcher) else matcher)
        for row, matcher in rows
    ]
