"""A message's content blocks as they form: thinking, text and tool uses, each
opened, added to and closed in order, written as Anthropic's stream events.

One writer serves both answers: a streamed message sends the events as they
come; a whole message is the blocks the writer ends with, so the two agree.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from sluiceway.protocol import anthropic as wire

Event = wire.StreamEvent


@attrs.define
class BlockWriter:
    """The blocks of one message. `blocks` holds each block's final wire form;
    every method returns the events its change makes."""

    blocks: list[dict[str, Any]] = attrs.field(factory=list)
    _kind: str | None = None  # the open block's type
    _arguments: str = ""  # the open tool use's input JSON so far

    @property
    def _index(self) -> int:
        return len(self.blocks) - 1

    def thinking(self, text: str) -> list[Event]:
        if not text:
            return []
        events = self._open("thinking", wire.ThinkingBlock("").to_dict())
        self.blocks[-1]["thinking"] += text
        events.append(wire.ContentBlockDelta(self._index, wire.thinking_delta(text)))
        return events

    def text(self, text: str) -> list[Event]:
        if not text:
            return []
        events = self._open("text", wire.TextBlock("").to_dict())
        self.blocks[-1]["text"] += text
        events.append(wire.ContentBlockDelta(self._index, wire.text_delta(text)))
        return events

    def tool_use(self, call_id: str, name: str) -> list[Event]:
        """A new tool use (always a block of its own)."""
        events = self.close()
        self._kind, self._arguments = "tool_use", ""
        self.blocks.append(wire.ToolUseBlock(call_id, name).to_dict())
        events.append(wire.ContentBlockStart(self._index, dict(self.blocks[-1])))
        return events

    def tool_input(self, partial_json: str) -> list[Event]:
        """More of the open tool use's input JSON."""
        if not partial_json or self._kind != "tool_use":
            return []
        self._arguments += partial_json
        return [wire.ContentBlockDelta(self._index, wire.input_json_delta(partial_json))]

    def close(self) -> list[Event]:
        """Close the open block, if any. A thinking block ends with its (empty)
        signature, as Anthropic's do; a tool use's input becomes the object its
        JSON says (an input cut short stays `{}`)."""
        if self._kind is None:
            return []
        events: list[Event] = []
        if self._kind == "thinking":
            events.append(wire.ContentBlockDelta(self._index, wire.signature_delta("")))
        elif self._kind == "tool_use" and self._arguments:
            try:
                value = json.loads(self._arguments)
            except ValueError:
                value = None
            if isinstance(value, dict):
                self.blocks[-1]["input"] = value
        events.append(wire.ContentBlockStop(self._index))
        self._kind = None
        return events

    def _open(self, kind: str, block: dict[str, Any]) -> list[Event]:
        if self._kind == kind:
            return []
        events = self.close()
        self._kind = kind
        self.blocks.append(block)
        events.append(wire.ContentBlockStart(self._index, dict(block)))
        return events

    @property
    def has_tool_use(self) -> bool:
        return any(block["type"] == "tool_use" for block in self.blocks)
