"""OpenAI wire types, shared by the HTTP server and the trio client.

Every type is a frozen attrs class with ``from_dict`` (lenient: unknown keys are
ignored, missing optional keys take their defaults, so the client also reads
other OpenAI-compatible servers) and ``to_dict`` (exact: the fields OpenAI sends,
with ``null`` where OpenAI sends ``null``; sluiceway extensions such as
``stop_reason`` are left out while they are ``None``).

This module is light on purpose: it imports only attrs and the standard library.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

__all__ = [
    "ChatCompletion",
    "ChatCompletionChoice",
    "ChatCompletionChunk",
    "ChatCompletionChunkChoice",
    "ChatLogprobs",
    "ChatMessage",
    "ChatTokenLogprob",
    "Completion",
    "CompletionChoice",
    "CompletionChunk",
    "CompletionLogprobs",
    "DeltaMessage",
    "ErrorObject",
    "Model",
    "ModelList",
    "PromptTokensDetails",
    "TokenizeResponse",
    "TopLogprob",
    "Usage",
]

JSON = dict[str, Any]


def _opt(cls: Any, value: Any) -> Any:
    return None if value is None else cls.from_dict(value)

def _envelope_fields(d: Mapping[str, Any], choice_type: Any, default_object: str) -> JSON:
    """Constructor arguments shared by the four response envelopes (full and chunked,
    chat and completions); they differ only in their choice type and object name."""
    return {
        "id": str(d.get("id", "")),
        "model": str(d.get("model", "")),
        "choices": [choice_type.from_dict(c) for c in d.get("choices") or []],
        "created": int(d.get("created") or 0),
        "usage": _opt(Usage, d.get("usage")),
        "object": d.get("object") or default_object,
        "system_fingerprint": d.get("system_fingerprint"),
    }


def _envelope_dict(envelope: Any, *, usage_always: bool) -> JSON:
    """The wire form of an envelope. Full responses always carry `usage` (null when
    unknown); a chunk carries it only when it is the usage chunk."""
    d: JSON = {
        "id": envelope.id,
        "object": envelope.object,
        "created": envelope.created,
        "model": envelope.model,
        "system_fingerprint": envelope.system_fingerprint,
        "choices": [c.to_dict() for c in envelope.choices],
    }
    if usage_always or envelope.usage is not None:
        d["usage"] = None if envelope.usage is None else envelope.usage.to_dict()
    return d


def _drop_none(d: JSON, *keys: str) -> JSON:
    for key in keys:
        if d.get(key) is None:
            d.pop(key, None)
    return d


# --------------------------------------------------------------------------- errors


@attrs.frozen
class ErrorObject:
    """The body of an OpenAI error response: ``{"error": {...}}``."""

    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | int | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ErrorObject:
        """Accepts either the inner object or the whole ``{"error": {...}}`` body."""
        inner = d.get("error", d)
        if isinstance(inner, str):  # some servers send {"error": "text"}
            return cls(message=inner, type="error")
        return cls(
            message=str(inner.get("message", "")),
            type=str(inner.get("type") or "error"),
            param=inner.get("param"),
            code=inner.get("code"),
        )

    def to_dict(self) -> JSON:
        """The whole response body, ``{"error": {...}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


# -------------------------------------------------------------------------- usage


@attrs.frozen
class PromptTokensDetails:
    cached_tokens: int = 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PromptTokensDetails:
        return cls(cached_tokens=int(d.get("cached_tokens") or 0))

    def to_dict(self) -> JSON:
        return {"cached_tokens": self.cached_tokens}


@attrs.frozen
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Usage:
        return cls(
            prompt_tokens=int(d.get("prompt_tokens") or 0),
            completion_tokens=int(d.get("completion_tokens") or 0),
            total_tokens=int(d.get("total_tokens") or 0),
            prompt_tokens_details=_opt(PromptTokensDetails, d.get("prompt_tokens_details")),
        )

    def to_dict(self) -> JSON:
        d: JSON = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }
        if self.prompt_tokens_details is not None:
            d["prompt_tokens_details"] = self.prompt_tokens_details.to_dict()
        return d


# ---------------------------------------------------------------------- logprobs


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


# ---------------------------------------------------------------------------- chat


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
            logprobs=_opt(ChatLogprobs, d.get("logprobs")),
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
        return _drop_none(d, "stop_reason")


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
        return cls(**_envelope_fields(d, ChatCompletionChoice, "chat.completion"))

    def to_dict(self) -> JSON:
        return _envelope_dict(self, usage_always=True)


@attrs.frozen
class DeltaMessage:
    """What one streamed chunk adds to a chat choice."""

    role: str | None = None
    content: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeltaMessage:
        return cls(role=d.get("role"), content=d.get("content"))

    def to_dict(self) -> JSON:
        return _drop_none({"role": self.role, "content": self.content}, "role")


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
            logprobs=_opt(ChatLogprobs, d.get("logprobs")),
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
        return _drop_none(d, "stop_reason")


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

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ChatCompletionChunk:
        return cls(**_envelope_fields(d, ChatCompletionChunkChoice, "chat.completion.chunk"))

    def to_dict(self) -> JSON:
        return _envelope_dict(self, usage_always=False)


# --------------------------------------------------------------------- completions


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
            logprobs=_opt(CompletionLogprobs, d.get("logprobs")),
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
        return _drop_none(d, "stop_reason")


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
        return cls(**_envelope_fields(d, CompletionChoice, "text_completion"))

    def to_dict(self) -> JSON:
        return _envelope_dict(self, usage_always=True)


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

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CompletionChunk:
        return cls(**_envelope_fields(d, CompletionChoice, "text_completion"))

    def to_dict(self) -> JSON:
        return _envelope_dict(self, usage_always=False)


# --------------------------------------------------------------------------- models


@attrs.frozen
class Model:
    id: str
    created: int = 0
    owned_by: str = "sluiceway"
    object: str = "model"
    max_model_len: int | None = None  # vLLM-style extension

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Model:
        return cls(
            id=str(d["id"]),
            created=int(d.get("created") or 0),
            owned_by=d.get("owned_by") or "",
            object=d.get("object") or "model",
            max_model_len=d.get("max_model_len"),
        )

    def to_dict(self) -> JSON:
        d: JSON = {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "owned_by": self.owned_by,
            "max_model_len": self.max_model_len,
        }
        return _drop_none(d, "max_model_len")


@attrs.frozen
class ModelList:
    data: list[Model] = attrs.field(factory=list)
    object: str = "list"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelList:
        return cls(
            data=[Model.from_dict(m) for m in d.get("data") or []],
            object=d.get("object") or "list",
        )

    def to_dict(self) -> JSON:
        return {"object": self.object, "data": [m.to_dict() for m in self.data]}


@attrs.frozen
class TokenizeResponse:
    """``POST /tokenize`` (sluiceway extension)."""

    tokens: list[int]
    count: int
    max_model_len: int | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TokenizeResponse:
        tokens = list(d.get("tokens") or [])
        return cls(
            tokens=tokens,
            count=int(d.get("count", len(tokens))),
            max_model_len=d.get("max_model_len"),
        )

    def to_dict(self) -> JSON:
        return {"tokens": self.tokens, "count": self.count, "max_model_len": self.max_model_len}
