"""Chat completions: full responses and streamed chunks."""

from __future__ import annotations

import attrs

from sluiceway.protocol._codec import Wire
from sluiceway.protocol.envelope import CHUNK_NULL_FLAGS, CHUNK_OMIT_NONE, ENVELOPE_ORDER
from sluiceway.protocol.logprobs import ChatLogprobs
from sluiceway.protocol.tools import DeltaToolCall, ToolCall
from sluiceway.protocol.usage import Usage


@attrs.frozen
class ChatMessage(Wire):
    """An assistant message in a non-streamed chat completion: its text, or null
    when it is only `tool_calls`. `reasoning_content` is a reasoning model's
    thinking, left out while the server parses none (vLLM's extension)."""

    role: str = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None

    wire_order = ("role", "content", "reasoning_content", "tool_calls")
    wire_omit_none = frozenset({"tool_calls", "reasoning_content"})


@attrs.frozen
class ChatCompletionChoice(Wire):
    """``index`` is ``prompt_index * n + j`` for batch chat (sluiceway extension)."""

    index: int
    message: ChatMessage
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None
    stop_reason: str | int | None = None  # sluiceway/vLLM extension

    wire_order = ("index", "message", "logprobs", "finish_reason", "stop_reason")
    wire_omit_none = frozenset({"stop_reason"})


@attrs.frozen
class ChatCompletion(Wire):
    id: str
    model: str
    choices: list[ChatCompletionChoice]
    created: int = 0
    usage: Usage | None = None
    object: str = "chat.completion"
    system_fingerprint: str | None = None

    wire_order = ENVELOPE_ORDER


@attrs.frozen
class DeltaMessage(Wire):
    """What one streamed chunk adds to a chat choice."""

    role: str | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None
    reasoning_content: str | None = None

    wire_order = ("role", "content", "reasoning_content", "tool_calls")
    # A chunk that ends a choice, or carries only tool calls or thinking, has no
    # content key.
    wire_omit_none = frozenset({"role", "content", "tool_calls", "reasoning_content"})


@attrs.frozen
class ChatCompletionChunkChoice(Wire):
    index: int
    delta: DeltaMessage = attrs.field(factory=DeltaMessage)
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None
    stop_reason: str | int | None = None

    wire_order = ("index", "delta", "logprobs", "finish_reason", "stop_reason")
    wire_omit_none = frozenset({"stop_reason"})

    @property
    def text(self) -> str:
        """The content this chunk adds ('' when none), same name as CompletionChoice."""
        return self.delta.content or ""


@attrs.frozen
class ChatCompletionChunk(Wire):
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

    wire_order = ENVELOPE_ORDER
    wire_omit_none = CHUNK_OMIT_NONE
    wire_null_flags = CHUNK_NULL_FLAGS
