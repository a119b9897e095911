"""Specs -> grammars the engine can follow token by token (llguidance).

Compiling is cheap for ordinary schemas (`benchmarks/grammar_backends.py`
measures it): llguidance
builds the lexer lazily, as masks are computed, within its per-step limits
(`LLParserLimits`: about 15 ms of lexer work per token at most), so no grammar can
make one step hang. The server still compiles off the event loop, under a time
bound, and caches by spec.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable
from typing import Any

import llguidance
import llguidance.hf

from sluiceway.grammar.spec import JSON_OPTIONS, GrammarSpec

_MAX_MESSAGE = 400


class GrammarError(ValueError):
    """A spec cannot be compiled; the message says what is wrong or unsupported."""


def _first_lines(message: str) -> str:
    text = message.strip().split("\n<state>")[0].strip()
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


class GrammarMatcher:
    """One choice's position in its grammar. Used by one thread at a time: the
    engine loop's step, which fills masks (on the mask thread) and then accepts
    tokens, never both at once."""

    __slots__ = ("raw", "vocab_size")

    def __init__(self, raw: llguidance.LLMatcher, vocab_size: int) -> None:
        self.raw = raw
        self.vocab_size = vocab_size

    def accept_token(self, token_id: int) -> bool:
        """Advance past `token_id`; False if the grammar does not allow it (the
        matcher then stays in an error state)."""
        return bool(self.raw.consume_token(token_id))

    def is_stopped(self) -> bool:
        """Nothing but the end of the output may follow (or the matcher failed)."""
        return bool(self.raw.is_stopped())

    def error(self) -> str | None:
        return _first_lines(self.raw.get_error()) if self.raw.is_error() else None


class CompiledGrammar:
    """A grammar ready to constrain choices; shared, read-only, safe across threads."""

    def __init__(self, spec: GrammarSpec, pristine: llguidance.LLMatcher, vocab_size: int) -> None:
        self.spec = spec
        self._pristine = pristine
        self._vocab_size = vocab_size

    def new_matcher(self) -> GrammarMatcher:
        """A matcher at the start of the grammar (a copy: microseconds)."""
        return GrammarMatcher(self._pristine.deep_copy(), self._vocab_size)


class GrammarCompiler:
    """Compiles specs for one tokenizer, caching the last `cache_size` grammars.

    Thread-safe. The tokenizer's vocabulary is read once, on first use (about half
    a second for the default model); `eos_token_ids` are what the grammar allows
    where the output may end.
    """

    def __init__(self, tokenizer: Any, eos_token_ids: Iterable[int], cache_size: int = 256) -> None:
        self._tokenizer = tokenizer
        self._eos = sorted(eos_token_ids)
        self._cache_size = cache_size
        self._cache: collections.OrderedDict[GrammarSpec, CompiledGrammar] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._vocabulary: llguidance.LLTokenizer | None = None

    def vocabulary(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._vocabulary is None:
                self._vocabulary = llguidance.hf.from_tokenizer(
                    self._tokenizer, eos_token=self._eos or None
                )
            return self._vocabulary

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """The grammar of `spec`, from the cache or compiled now (blocking: call it
        off the event loop). Raises GrammarError for an invalid or unsupported one."""
        with self._lock:
            hit = self._cache.get(spec)
            if hit is not None:
                self._cache.move_to_end(spec)
                return hit
        compiled = self._compile(spec)
        with self._lock:
            self._cache[spec] = compiled
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, spec: GrammarSpec) -> CompiledGrammar:
        vocabulary = self.vocabulary()
        # What the library raises for a spec it cannot take (ValueError, its own
        # errors from the Rust side) is the client's to fix: a GrammarError.
        try:
            if spec.kind == "json_schema":
                grammar = llguidance.LLMatcher.grammar_from_json_schema(
                    spec.source, defaults=JSON_OPTIONS
                )
            elif spec.kind == "regex":
                grammar = llguidance.LLMatcher.grammar_from_regex(spec.source)
            else:
                grammar = llguidance.LLMatcher.grammar_from_lark(spec.source)
            failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
                grammar, vocabulary
            )
            if failed:
                raise GrammarError(_first_lines(messages[0] if messages else "invalid grammar"))
            matcher = llguidance.LLMatcher(vocabulary, grammar, log_level=0)
        except GrammarError:
            raise
        except Exception as exc:
            raise GrammarError(_first_lines(str(exc)) or type(exc).__name__) from None
        if matcher.is_error():
            raise GrammarError(_first_lines(matcher.get_error()))
        return CompiledGrammar(spec, matcher, vocabulary.vocab_size)
