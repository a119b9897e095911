"""Chat completions: full responses and streamed chunks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from sluiceway.protocol._codec import JSON, drop_none, opt
from sluiceway.protocol.envelope import envelope_dict, envelope_fields
from sluiceway.protocol.logprobs import ChatLogprobs
from sluiceway.protocol.usage import Usage


@attrs.frozen
class ChatMessage:
    """An assistant message in a non-streamed chat completion."""

    role: str = "assistant"
    content: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ChatMessage:
        return cls(role=d.get("role") or "assistant", content=d.get("content"))

    def to_dict(self) -> JSON:
        return {"role": self.role, "content": self.content}


@attrs.frozen
class ChatCompletionChoice:
    """``index`` is ``prompt_index * n + j`` for batch chat (sluiceway extension)."""

    index: int
    message: ChatMessage
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None
    stop_reason: str | int | None = None  # sluiceway/vLLM extension

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ChatCompletionChoice:
        return cls(
            index=int(d.get("index") or 0),
            message=ChatMessage.from_dict(d.get("message") or {}),
            finish_reason=d.get("finish_reason"),
            logprobs=opt(ChatLogprobs, d.get("logprobs")),
            stop_reason=d.get("stop_reason"),
        )

    def to_dict(self) -> JSON:
        d: JSON = {
            "index": self.index,
            "message": self.message.to_dict(),
            "logprobs": None if self.logprobs is None else self.logprobs.to_dict(),
            "finish_reason": self.finish_reason,
            "stop_reason": self.stop_reason,
        }
        return drop_none(d, "stop_reason")


@attrs.frozen
class ChatCompletion:
    id: str
    model: str
    choices: list[ChatCompletionChoice]
    created: int = 0
    usage: Usage | None = None
    object: str = "chat.completion"
    system_fingerprint: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ChatCompletion:
        return cls(**envelope_fields(d, ChatCompletionChoice, "chat.completion"))

    def to_dict(self) -> JSON:
        return envelope_dict(self, usage_always=True)


@attrs.frozen
class DeltaMessage:
    """What one streamed chunk adds to a chat choice."""

    role: str | None = None
    content: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeltaMessage:
        return cls(role=d.get("role"), content=d.get("content"))

    def to_dict(self) -> JSON:
        return drop_none({"role": self.role, "content": self.content}, "role")


@attrs.frozen
class ChatCompletionChunkChoice:
    index: int
    delta: DeltaMessage = attrs.field(factory=DeltaMessage)
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None
    stop_reason: str | int | None = None

    @property
    def text(self) -> str:
        """The content this chunk adds ('' when none), same name as CompletionChoice."""
        return self.delta.content or ""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ChatCompletionChunkChoice:
        return cls(
            index=int(d.get("index") or 0),
            delta=DeltaMessage.from_dict(d.get("delta") or {}),
            finish_reason=d.get("finish_reason"),
            logprobs=opt(ChatLogprobs, d.get("logprobs")),
            stop_reason=d.get("stop_reason"),
        )

    def to_dict(self) -> JSON:
        d: JSON = {
            "index": self.index,
            "delta": self.delta.to_dict(),
            "logprobs": None if self.logprobs is None else self.logprobs.to_dict(),
            "finish_reason": self.finish_reason,
            "stop_reason": self.stop_reason,
        }
        return drop_none(d, "stop_reason")


@attrs.frozen
class ChatCompletionChunk:
    """One ``data:`` event of a streamed chat completion.

    The final usage chunk (``stream_options.include_usage``) has no choices.
    """

    id: str
    model: str
    choices: list[ChatCompletionChunkChoice]
    created: int = 0
    usage: Usage | None = None
    object: str = "chat.completion.chunk"
    system_fingerprint: str | None = None
    # The chunk carries `"usage": null`: its stream asked for usage
    # (stream_options.include_usage), which comes in the last chunk.
    usage_null: bool = attrs.field(default=False, kw_only=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ChatCompletionChunk:
        return cls(
            **envelope_fields(d, ChatCompletionChunkChoice, "chat.completion.chunk"),
            usage_null="usage" in d and d["usage"] is None,
        )

    def to_dict(self) -> JSON:
        return envelope_dict(self, usage_always=self.usage_null)
