"""OpenAI wire objects built from engine deltas: logprobs and usage as protocol
types. Chunks and full responses are the protocol types themselves
(`completion_shapes`); a chunk that carries only text is encoded from a template
compiled from its type once per choice (`sse.EventTemplate`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from sluiceway import protocol
from sluiceway.engine.outputs import TokenLogprob

# JSON has no -inf; OpenAI-compatible servers report impossible tokens like this.
_MIN_LOGPROB = -9999.0


class TokenText:
    """Each token id's own text, decoded once and cached (for logprobs)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id])
            self._cache[token_id] = text
        return text


def _lp(value: float) -> float:
    return value if math.isfinite(value) else _MIN_LOGPROB


def chat_logprobs(
    logprobs: Sequence[TokenLogprob], token_text: TokenText, top_n: int
) -> list[protocol.ChatTokenLogprob]:
    """Chat format, per token: its text, logprob, UTF-8 bytes and the `top_n` alternatives."""
    out = []
    for lp in logprobs:
        text = token_text(lp.token_id)
        tops = [
            protocol.TopLogprob((t := token_text(tid)), _lp(v), list(t.encode("utf-8")))
            for tid, v in lp.top[:top_n]
        ]
        out.append(
            protocol.ChatTokenLogprob(text, _lp(lp.logprob), list(text.encode("utf-8")), tops)
        )
    return out


def completion_logprobs(
    logprobs: Sequence[TokenLogprob], token_text: TokenText, text_offset: int
) -> protocol.CompletionLogprobs:
    """Legacy completions format: parallel arrays; `text_offset` of the first token given."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for lp in logprobs:
        text = token_text(lp.token_id)
        tokens.append(text)
        token_logprobs.append(_lp(lp.logprob))
        tops.append({token_text(tid): _lp(v) for tid, v in lp.top})
        offsets.append(text_offset)
        text_offset += len(text)
    return protocol.CompletionLogprobs(tokens, list(token_logprobs), tops, offsets)


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> protocol.Usage:
    """Token counts; prompt-cache hits are reported only when there were some."""
    details = protocol.PromptTokensDetails(cached_tokens) if cached_tokens else None
    return protocol.Usage(
        prompt_tokens, completion_tokens, prompt_tokens + completion_tokens, details
    )
