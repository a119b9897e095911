"""Log-probabilities in the chat format and in the legacy completions format."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from sluiceway.protocol._codec import JSON


@attrs.frozen
class TopLogprob:
    """One alternative token in the chat logprobs format."""

    token: str
    logprob: float
    bytes: list[int] | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TopLogprob:
        return cls(token=d["token"], logprob=float(d["logprob"]), bytes=d.get("bytes"))

    def to_dict(self) -> JSON:
        return {"token": self.token, "logprob": self.logprob, "bytes": self.bytes}


@attrs.frozen
class ChatTokenLogprob:
    """One generated token in the chat logprobs format."""

    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = attrs.field(factory=list)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ChatTokenLogprob:
        return cls(
            token=d["token"],
            logprob=float(d["logprob"]),
            bytes=d.get("bytes"),
            top_logprobs=[TopLogprob.from_dict(t) for t in d.get("top_logprobs") or []],
        )

    def to_dict(self) -> JSON:
        return {
            "token": self.token,
            "logprob": self.logprob,
            "bytes": self.bytes,
            "top_logprobs": [t.to_dict() for t in self.top_logprobs],
        }


@attrs.frozen
class ChatLogprobs:
    """``choice.logprobs`` of the chat API: ``{"content": [...], "refusal": null}``."""

    content: list[ChatTokenLogprob] | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ChatLogprobs:
        content = d.get("content")
        return cls(
            content=None if content is None else [ChatTokenLogprob.from_dict(t) for t in content]
        )

    def to_dict(self) -> JSON:
        content = None if self.content is None else [t.to_dict() for t in self.content]
        return {"content": content, "refusal": None}


@attrs.frozen
class CompletionLogprobs:
    """``choice.logprobs`` of the legacy completions API (parallel lists)."""

    tokens: list[str] = attrs.field(factory=list)
    token_logprobs: list[float | None] = attrs.field(factory=list)
    top_logprobs: list[dict[str, float]] | None = None
    text_offset: list[int] = attrs.field(factory=list)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CompletionLogprobs:
        return cls(
            tokens=list(d.get("tokens") or []),
            token_logprobs=list(d.get("token_logprobs") or []),
            top_logprobs=d.get("top_logprobs"),
            text_offset=list(d.get("text_offset") or []),
        )

    def to_dict(self) -> JSON:
        return {
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        }
