"""The Responses API (`POST /v1/responses`): the request body, the response
object with its output items, and the named events of a streamed response.

Input items, tools and `text.format` arrive as JSON objects and are checked by
the server item by item (a 400 naming `input[i]...`), since their shapes vary by
`type`; what the server answers is typed here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import attrs
from msgspec import Meta

from sluiceway.protocol._codec import Wire
from sluiceway.protocol.constraints import Count, NonNegative, Temperature, TopP

InputItems = Annotated[list[dict[str, Any]], Meta(min_length=1)]


@attrs.frozen(kw_only=True)
class ResponseCreateRequest:
    """`POST /v1/responses`. `input` is a user message's text, or a list of items:
    messages (`role` and `content`), `function_call`s and `function_call_output`s.
    `store` (default true) keeps the response for `GET /v1/responses/{id}` and for
    a later request's `previous_response_id`, which continues its conversation."""

    input: str | InputItems
    model: str | None = None
    instructions: str | None = None
    max_output_tokens: Count | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: int | None = None  # sluiceway extension, as on the chat endpoint
    stream: bool | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    background: bool | None = None
    user: str | None = None
    reasoning: ReasoningOptions | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # as on chat completions
    max_reasoning_tokens: NonNegative | None = None


@attrs.frozen(kw_only=True)
class ReasoningOptions:
    """`reasoning`: `effort` caps the thinking as `reasoning_effort` does on chat
    completions; `summary` asks for a summary of it (none is written: the
    `reasoning` item carries the thinking itself, its `summary` stays empty)."""

    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


@attrs.frozen
class OutputText(Wire):
    text: str
    type: str = "output_text"
    annotations: list[Any] = attrs.field(factory=list)
    logprobs: list[Any] = attrs.field(factory=list)

    wire_order = ("type", "text", "annotations", "logprobs")


@attrs.frozen
class OutputMessage(Wire):
    """The assistant's text, one `output_text` part."""

    id: str
    content: list[OutputText] = attrs.field(factory=list)
    status: str = "completed"
    type: str = "message"
    role: str = "assistant"

    wire_order = ("type", "id", "status", "role", "content")


@attrs.frozen
class FunctionCallItem(Wire):
    """A call of one of the request's function tools; `call_id` is what the
    `function_call_output` answering it names."""

    id: str
    call_id: str
    name: str
    arguments: str
    status: str = "completed"
    type: str = "function_call"

    wire_order = ("type", "id", "call_id", "name", "arguments", "status")


@attrs.frozen
class ReasoningText(Wire):
    text: str
    type: str = "reasoning_text"

    wire_order = ("type", "text")


@attrs.frozen
class ReasoningItem(Wire):
    """A reasoning model's thinking, the output item before its answer: the
    thinking as one `reasoning_text` part; `summary` is empty (none is written)."""

    id: str
    content: list[ReasoningText] = attrs.field(factory=list)
    summary: list[Any] = attrs.field(factory=list)
    status: str = "completed"
    type: str = "reasoning"

    wire_order = ("type", "id", "summary", "content", "status")

    @property
    def text(self) -> str:
        return "".join(part.text for part in self.content)


OutputItem = OutputMessage | FunctionCallItem | ReasoningItem


@attrs.frozen
class InputText(Wire):
    text: str
    type: str = "input_text"

    wire_order = ("type", "text")


@attrs.frozen
class InputMessageItem(Wire):
    """A user, system or developer message of a request's input, as
    `GET /v1/responses/{id}/input_items` lists it (an assistant message there is an
    `OutputMessage`)."""

    id: str
    role: str
    content: list[InputText] = attrs.field(factory=list)
    status: str = "completed"
    type: str = "message"

    wire_order = ("type", "id", "status", "role", "content")


@attrs.frozen
class FunctionCallOutputItem(Wire):
    """What the caller's function returned for the call `call_id`: its text, or
    its `input_text` parts (an `InputText`'s wire form each)."""

    id: str
    call_id: str
    output: str | list[dict[str, Any]]
    status: str = "completed"
    type: str = "function_call_output"

    wire_order = ("type", "id", "call_id", "output", "status")


InputItem = InputMessageItem | OutputMessage | FunctionCallItem | FunctionCallOutputItem

# The `include` values OpenAI documents for a response and its input items. None
# adds anything here (no file search, images, reasoning or logprobs of input), so
# each is accepted and ignored; any other value is a 400.
INCLUDABLE = frozenset(
    {
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "message.input_image.image_url",
        "computer_call_output.output.image_url",
        "code_interpreter_call.outputs",
        "reasoning.encrypted_content",
        "message.output_text.logprobs",
    }
)


@attrs.frozen
class ResponseItemList(Wire):
    """A page of a response's input items (`GET /v1/responses/{id}/input_items`):
    each item's wire form, an `InputItem`'s. `first_id` and `last_id` are this
    page's; `has_more`: more follow after `last_id` in the same order."""

    data: list[dict[str, Any]]
    object: str = "list"
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False

    wire_order = ("object", "data", "first_id", "last_id", "has_more")


@attrs.frozen
class InputTokensDetails(Wire):
    cached_tokens: int = 0


@attrs.frozen
class OutputTokensDetails(Wire):
    reasoning_tokens: int = 0


@attrs.frozen
class ResponseUsage(Wire):
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    input_tokens_details: InputTokensDetails = attrs.field(factory=InputTokensDetails)
    output_tokens_details: OutputTokensDetails = attrs.field(factory=OutputTokensDetails)


@attrs.frozen
class ResponseError(Wire):
    code: str
    message: str


@attrs.frozen
class IncompleteDetails(Wire):
    reason: str  # "max_output_tokens"


@attrs.frozen(kw_only=True)
class Response(Wire):
    """A response object. `status`: in_progress, completed, incomplete (cut by
    `max_output_tokens`), failed (`error` says why) or cancelled. `output` holds
    each item's wire form (messages and function calls, in order)."""

    id: str
    created_at: int
    model: str
    status: str
    output: list[dict[str, Any]] = attrs.field(factory=list)
    usage: ResponseUsage | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict[str, Any]] = attrs.field(factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    text: dict[str, Any] = attrs.field(factory=lambda: {"format": {"type": "text"}})
    metadata: dict[str, str] = attrs.field(factory=dict)
    store: bool = True
    background: bool = False
    object: str = "response"

    wire_order = (
        "id",
        "object",
        "created_at",
        "status",
        "background",
        "error",
        "incomplete_details",
        "instructions",
        "max_output_tokens",
        "model",
        "output",
        "parallel_tool_calls",
        "previous_response_id",
        "store",
        "temperature",
        "text",
        "tool_choice",
        "tools",
        "top_p",
        "usage",
        "metadata",
    )


@attrs.frozen
class ResponseDeleted(Wire):
    id: str
    object: str = "response"
    deleted: bool = True
