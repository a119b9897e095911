"""Legacy completions: full responses and streamed chunks (same choice shape)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from sluiceway.protocol._codec import JSON, drop_none, opt
from sluiceway.protocol.envelope import envelope_dict, envelope_fields
from sluiceway.protocol.logprobs import CompletionLogprobs
from sluiceway.protocol.usage import Usage


@attrs.frozen
class CompletionChoice:
    """A choice of the completions API, streamed or not (same shape in both).

    ``index`` is ``prompt_index * n + j`` for a list of prompts.
    """

    index: int
    text: str = ""
    finish_reason: str | None = None
    logprobs: CompletionLogprobs | None = None
    stop_reason: str | int | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CompletionChoice:
        return cls(
            index=int(d.get("index") or 0),
            text=d.get("text") or "",
            finish_reason=d.get("finish_reason"),
            logprobs=opt(CompletionLogprobs, d.get("logprobs")),
            stop_reason=d.get("stop_reason"),
        )

    def to_dict(self) -> JSON:
        d: JSON = {
            "index": self.index,
            "text": self.text,
            "logprobs": None if self.logprobs is None else self.logprobs.to_dict(),
            "finish_reason": self.finish_reason,
            "stop_reason": self.stop_reason,
        }
        return drop_none(d, "stop_reason")


@attrs.frozen
class Completion:
    id: str
    model: str
    choices: list[CompletionChoice]
    created: int = 0
    usage: Usage | None = None
    object: str = "text_completion"
    system_fingerprint: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Completion:
        return cls(**envelope_fields(d, CompletionChoice, "text_completion"))

    def to_dict(self) -> JSON:
        return envelope_dict(self, usage_always=True)


@attrs.frozen
class CompletionChunk:
    """One ``data:`` event of a streamed completion (OpenAI calls it text_completion too)."""

    id: str
    model: str
    choices: list[CompletionChoice]
    created: int = 0
    usage: Usage | None = None
    object: str = "text_completion"
    system_fingerprint: str | None = None
    # The chunk carries `"usage": null`: its stream asked for usage
    # (stream_options.include_usage), which comes in the last chunk.
    usage_null: bool = attrs.field(default=False, kw_only=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CompletionChunk:
        return cls(
            **envelope_fields(d, CompletionChoice, "text_completion"),
            usage_null="usage" in d and d["usage"] is None,
        )

    def to_dict(self) -> JSON:
        return envelope_dict(self, usage_always=self.usage_null)
