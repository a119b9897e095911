"""Chat messages as a request carries them."""

from __future__ import annotations

from typing import Literal

import attrs

Role = Literal["system", "developer", "user", "assistant", "tool"]


@attrs.frozen
class TextPart:
    """A content part; only text is supported."""

    type: Literal["text"]
    text: str


@attrs.frozen
class ChatMessageParam:
    """One message of a conversation. `content` may be null only for the assistant."""

    role: Role
    content: str | list[TextPart] | None = None
    name: str | None = None

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

    def for_template(self) -> dict[str, str]:
        """`{"role", "content"[, "name"]}` with string content, as chat templates read it."""
        message = {"role": self.role, "content": self.text()}
        if self.name is not None:
            message["name"] = self.name
        return message
