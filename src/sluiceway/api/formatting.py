"""OpenAI wire objects built from engine deltas: chunks, responses, logprobs, usage.

Plain dicts, encoded once per chunk; this is the only per-token work the HTTP
layer does on the event loop besides bookkeeping.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

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
) -> list[dict[str, Any]]:
    """Chat format: `{"token", "logprob", "bytes", "top_logprobs": [...]}` per token."""
    out = []
    for lp in logprobs:
        text = token_text(lp.token_id)
        out.append(
            {
                "token": text,
                "logprob": _lp(lp.logprob),
                "bytes": list(text.encode("utf-8")),
                "top_logprobs": [
                    {
                        "token": (t := token_text(tid)),
                        "logprob": _lp(v),
                        "bytes": list(t.encode("utf-8")),
                    }
                    for tid, v in lp.top[:top_n]
                ],
            }
        )
    return out


def completion_logprobs(
    logprobs: Sequence[TokenLogprob], token_text: TokenText, text_offset: int
) -> dict[str, Any]:
    """Legacy completions format: parallel arrays; `text_offset` of the first token given."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for lp in logprobs:
        text = token_text(lp.token_id)
        tokens.append(text)
        token_logprobs.append(_lp(lp.logprob))
        tops.append({token_text(tid): _lp(v) for tid, v in lp.top})
        offsets.append(text_offset)
        text_offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def merge_completion_logprobs(parts: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    if not parts:
        return None
    merged: dict[str, list[Any]] = {
        "tokens": [],
        "token_logprobs": [],
        "top_logprobs": [],
        "text_offset": [],
    }
    for part in parts:
        for key, values in merged.items():
            values.extend(part[key])
    return merged


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


def chat_chunk_choice(
    index: int,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    logprobs: list[dict[str, Any]] | None = None,
    stop_reason: str | int | None = None,
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": index,
        "delta": delta,
        "logprobs": None if logprobs is None else {"content": logprobs},
        "finish_reason": finish_reason,
    }
    if finish_reason is not None:
        choice["stop_reason"] = stop_reason
    return choice


def completion_chunk_choice(
    index: int,
    text: str,
    finish_reason: str | None = None,
    logprobs: dict[str, Any] | None = None,
    stop_reason: str | int | None = None,
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
    }
    if finish_reason is not None:
        choice["stop_reason"] = stop_reason
    return choice


def envelope(
    kind: str, request_id: str, created: int, model: str, choices: list[dict[str, Any]]
) -> dict[str, Any]:
    """The object around choices: `kind` is the OpenAI `object` field."""
    return {
        "id": request_id,
        "object": kind,
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": choices,
    }
