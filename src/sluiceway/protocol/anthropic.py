"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`):
the request bodies, the message the server answers, the events of a streamed
message, and the error body, as Anthropic documents them.

A content block in a request is one class with every block type's fields (the
decoder cannot choose among several classes by `type`); `ContentBlockParam.problem`
says what a block of its type lacks. Response content blocks, stream events'
blocks and deltas are written as their wire forms (`list[dict]`), as the
Responses API's output items are, since their shapes vary by `type`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import attrs
from msgspec import Meta

from sluiceway.protocol._codec import JSON, Wire
from sluiceway.protocol.constraints import MAX_STOP, Count, Probability, StopString

# --- requests ---------------------------------------------------------------

BlockType = Literal[
    "text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking"
]

# What each block type needs besides `type`.
_REQUIRED: dict[str, tuple[str, ...]] = {
    "text": ("text",),
    "tool_use": ("id", "name", "input"),
    "tool_result": ("tool_use_id",),
    "thinking": ("thinking",),
    "redacted_thinking": ("data",),
    "image": ("source",),
    "document": ("source",),
}


@attrs.frozen(kw_only=True)
class ContentBlockParam:
    """One block of a message's content: `text`; `tool_use` (an assistant's call:
    `id`, `name`, `input`); `tool_result` (the answer to `tool_use_id`: `content`
    as text or text blocks, `is_error`); `thinking` (an assistant's earlier
    thinking, with its `signature`). `image`, `document` and `redacted_thinking`
    decode, and the server refuses or drops them."""

    type: BlockType
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: str | list[ContentBlockParam] | None = None
    is_error: bool | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None
    source: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None
    citations: Any = None

    def problem(self) -> str | None:
        """What this block lacks for its type (the missing field's name), or None."""
        for field in _REQUIRED[self.type]:
            if getattr(self, field) is None:
                return f"a {self.type} block needs `{field}`"
        return None

    def result_text(self) -> str:
        """A `tool_result`'s content as one string (text blocks joined by newlines)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(block.text or "" for block in self.content if block.type == "text")


@attrs.frozen
class MessageParam:
    """A turn: `user` or `assistant`, its content a string or blocks."""

    role: Literal["user", "assistant"]
    content: str | list[ContentBlockParam]

    def blocks(self) -> list[ContentBlockParam]:
        """The content as blocks (a string is one text block)."""
        if isinstance(self.content, str):
            return [ContentBlockParam(type="text", text=self.content)]
        return list(self.content)


@attrs.frozen(kw_only=True)
class TextBlockParam:
    """A block of a `system` prompt given as blocks."""

    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class ToolParam:
    """A client tool: `input_schema` is the JSON Schema of its input. (Anthropic's
    server tools, which carry a versioned `type`, are refused by the server.)"""

    name: Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_-]{1,128}$")]
    input_schema: dict[str, Any] | None = None
    description: str | None = None
    type: str | None = None
    cache_control: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class ToolChoiceParam:
    """`auto` (the model decides), `any` (some tool), `tool` (the one `name`d),
    `none`. `disable_parallel_tool_use`: at most one call."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


@attrs.frozen(kw_only=True)
class ThinkingParam:
    """`enabled` with a `budget_tokens` cap on the thinking, or `disabled`."""

    type: Literal["enabled", "disabled"]
    budget_tokens: Annotated[int, Meta(ge=0)] | None = None


@attrs.frozen(kw_only=True)
class MetadataParam:
    user_id: str | None = None


System = str | list[TextBlockParam]
Messages = Annotated[list[MessageParam], Meta(min_length=1)]


@attrs.frozen(kw_only=True)
class MessageCreateRequest:
    """`POST /v1/messages`. `max_tokens` is required, as Anthropic requires it."""

    model: str
    max_tokens: Count
    messages: Messages
    system: System | None = None
    stop_sequences: Annotated[list[StopString], Meta(max_length=MAX_STOP)] | None = None
    stream: bool | None = None
    temperature: Probability | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None
    metadata: MetadataParam | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingParam | None = None
    service_tier: str | None = None


@attrs.frozen(kw_only=True)
class CountTokensRequest:
    """`POST /v1/messages/count_tokens`: what the prompt of such a message holds."""

    model: str
    messages: Messages
    system: System | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingParam | None = None


def system_text(system: System | None) -> str | None:
    """A `system` prompt as one string (blocks joined by newlines)."""
    if system is None or isinstance(system, str):
        return system
    return "\n".join(block.text for block in system)


# --- responses --------------------------------------------------------------

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal"]


@attrs.frozen
class MessageUsage(Wire):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


@attrs.frozen
class TextBlock(Wire):
    text: str
    type: str = "text"

    wire_order = ("type", "text")


@attrs.frozen
class ThinkingBlock(Wire):
    """The model's thinking. `signature` is where Anthropic proves the thinking is
    its own; a local model's is empty."""

    thinking: str
    signature: str = ""
    type: str = "thinking"

    wire_order = ("type", "thinking", "signature")


@attrs.frozen
class ToolUseBlock(Wire):
    id: str
    name: str
    input: dict[str, Any] = attrs.field(factory=dict)
    type: str = "tool_use"

    wire_order = ("type", "id", "name", "input")


@attrs.frozen(kw_only=True)
class Message(Wire):
    """`POST /v1/messages`'s answer: `content` holds each block's wire form, in
    order (thinking, text, tool uses)."""

    id: str
    model: str
    content: list[JSON] = attrs.field(factory=list)
    stop_reason: str | None = None
    stop_sequence: str | None = None
    usage: MessageUsage = attrs.field(factory=MessageUsage)
    type: str = "message"
    role: str = "assistant"

    wire_order = ("id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage")


@attrs.frozen
class TokenCount(Wire):
    """`POST /v1/messages/count_tokens`'s answer."""

    input_tokens: int


# --- stream events ----------------------------------------------------------


@attrs.frozen
class MessageStart(Wire):
    message: Message
    type: str = "message_start"

    wire_order = ("type", "message")


@attrs.frozen
class ContentBlockStart(Wire):
    index: int
    content_block: JSON
    type: str = "content_block_start"

    wire_order = ("type", "index", "content_block")


@attrs.frozen
class ContentBlockDelta(Wire):
    """`delta` is a `text_delta`, `input_json_delta`, `thinking_delta` or
    `signature_delta` (`text_delta`, ... below)."""

    index: int
    delta: JSON
    type: str = "content_block_delta"

    wire_order = ("type", "index", "delta")


@attrs.frozen
class ContentBlockStop(Wire):
    index: int
    type: str = "content_block_stop"

    wire_order = ("type", "index")


@attrs.frozen
class MessageDeltaBody(Wire):
    stop_reason: str | None = None
    stop_sequence: str | None = None


@attrs.frozen
class DeltaUsage(Wire):
    output_tokens: int = 0


@attrs.frozen
class MessageDelta(Wire):
    """The message's end: why it stopped, and its output tokens in all."""

    delta: MessageDeltaBody
    usage: DeltaUsage
    type: str = "message_delta"

    wire_order = ("type", "delta", "usage")


@attrs.frozen
class MessageStop(Wire):
    type: str = "message_stop"


@attrs.frozen
class Ping(Wire):
    type: str = "ping"


# Every event a streamed message sends.
StreamEvent = (
    MessageStart | ContentBlockStart | ContentBlockDelta | ContentBlockStop | MessageDelta | MessageStop | Ping
)


def text_delta(text: str) -> JSON:
    return {"type": "text_delta", "text": text}


def thinking_delta(thinking: str) -> JSON:
    return {"type": "thinking_delta", "thinking": thinking}


def signature_delta(signature: str) -> JSON:
    return {"type": "signature_delta", "signature": signature}


def input_json_delta(partial_json: str) -> JSON:
    return {"type": "input_json_delta", "partial_json": partial_json}


# --- errors -----------------------------------------------------------------

# Anthropic's error types by HTTP status.
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "api_error",
    529: "overloaded_error",
}


@attrs.frozen
class ErrorDetail(Wire):
    type: str
    message: str


@attrs.frozen
class ErrorResponse(Wire):
    """`{"type": "error", "error": {"type": ..., "message": ...}}`."""

    error: ErrorDetail
    type: str = "error"

    wire_order = ("type", "error")

    @classmethod
    def for_status(cls, status: int, message: str) -> ErrorResponse:
        """The error a response of HTTP `status` carries (`api_error` for a status
        Anthropic names no type for)."""
        kind = ERROR_TYPES.get(
            status, "invalid_request_error" if 400 <= status < 500 else "api_error"
        )
        return cls(ErrorDetail(kind, message))
