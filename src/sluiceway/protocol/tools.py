"""Tools and structured outputs as requests carry them, and tool calls as both sides
write them (an assistant message in a request, a choice in a response, the same
type)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import attrs
from msgspec import Meta

from sluiceway.protocol._codec import Wire

# OpenAI's rule for function names.
FunctionName = Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]


@attrs.frozen
class FunctionDefinition:
    """A function the model may call; `parameters` is a JSON Schema (an object
    schema; none means any object)."""

    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


@attrs.frozen
class Tool:
    """`tools[i]`: only functions exist."""

    type: Literal["function"]
    function: FunctionDefinition


@attrs.frozen
class ToolChoiceFunction:
    name: str


@attrs.frozen
class NamedToolChoice:
    """`tool_choice: {"type": "function", "function": {"name": ...}}`: call this one."""

    type: Literal["function"]
    function: ToolChoiceFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


@attrs.frozen
class FunctionCall(Wire):
    """What a tool call calls: `arguments` is a JSON object as a string."""

    name: str
    arguments: str


@attrs.frozen
class ToolCall(Wire):
    """A call the assistant made: in a response's message, and in the assistant
    messages of a conversation that continues it."""

    id: str
    function: FunctionCall
    type: Literal["function"] = "function"

    wire_order = ("id", "type", "function")


@attrs.frozen
class DeltaFunctionCall(Wire):
    """A streamed piece of a call: the name once, then fragments of the arguments."""

    name: str | None = None
    arguments: str | None = None

    wire_omit_none = frozenset({"name", "arguments"})


@attrs.frozen
class DeltaToolCall(Wire):
    """`delta.tool_calls[i]` of a streamed chunk: the first for a call carries its
    `id`, `type` and name; later ones, with the same `index`, argument fragments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None

    wire_order = ("index", "id", "type", "function")
    wire_omit_none = frozenset({"id", "type", "function"})


@attrs.frozen
class JsonSchemaFormat:
    """`response_format.json_schema`: the output is valid against `schema`."""

    name: Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


@attrs.frozen
class ResponseFormat:
    """`text` (the default), `json_object` (any JSON object) or `json_schema`."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


@attrs.frozen(kw_only=True)
class StructuredOutputs:
    """vLLM's `structured_outputs` (exactly one field): output valid against the
    JSON Schema `json`, matching `regex`, exactly one of `choice`, or in the
    `grammar` (Lark or GBNF); `json_object`: any JSON object."""

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: Annotated[list[str], Meta(min_length=1)] | None = None
    grammar: str | None = None
    json_object: bool | None = None
