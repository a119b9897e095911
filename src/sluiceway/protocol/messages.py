"""Chat messages as a request carries them."""

from __future__ import annotations

from typing import Any, Literal

import attrs

from sluiceway.protocol.tools import ToolCall

Role = Literal["system", "developer", "user", "assistant", "tool"]


@attrs.frozen
class TextPart:
    """A content part; only text is supported."""

    type: Literal["text"]
    text: str


@attrs.frozen
class ChatMessageParam:
    """One message of a conversation. `content` may be null only for the assistant.
    An assistant message may carry the `tool_calls` it made; a `tool` message
    answers the call `tool_call_id`. `developer` is OpenAI's newer name for
    `system`, and is given to templates as `system`."""

    role: Role
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def __attrs_post_init__(self) -> None:
        # Worded as msgspec words a missing field, so the server names the field's
        # path (`messages[2].content`), as it does for every other missing field.
        if self.content is None and self.role != "assistant":
            raise ValueError("Object missing required field `content`")

    def text(self) -> str:
        """The content as one string: text parts joined by newlines, '' for null."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)

    def for_template(self) -> dict[str, Any]:
        """`{"role", "content"[, "name"][, "tool_calls"][, "tool_call_id"]}` with
        string content, as chat templates read it (tool calls in the OpenAI form,
        arguments as their JSON string)."""
        role = "system" if self.role == "developer" else self.role
        message: dict[str, Any] = {"role": role, "content": self.text()}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = [call.to_dict() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message
