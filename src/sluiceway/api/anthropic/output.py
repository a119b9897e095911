"""One choice's output as a Messages API answer: its text split into thinking
(the reasoning parser's), text and tool uses (the tool-call parser's), written
as content blocks by a `BlockWriter`, with the stop reason Anthropic names."""

from __future__ import annotations

import attrs

from sluiceway.api.anthropic.blocks import BlockWriter, Event
from sluiceway.api.pipeline.tool_calls import ToolCallParser
from sluiceway.protocol import anthropic as wire
from sluiceway.reasoning import ReasoningSplitter


def tool_use_id(call_id: str) -> str:
    """Anthropic's id form (`toolu_...`) of a parsed call's id."""
    return "toolu_" + call_id.removeprefix("call_")


@attrs.define
class MessageOutput:
    """Feeds on one choice's text deltas; each call returns the stream events the
    text makes certain. `writer.blocks` is the message's content at the end."""

    reasoning: ReasoningSplitter | None
    tools: ToolCallParser | None
    writer: BlockWriter = attrs.field(factory=BlockWriter)

    def feed(self, text: str, tokens: int) -> list[Event]:
        if self.reasoning is None:
            return self._answer(text)
        split = self.reasoning.feed(text, tokens)
        return self.writer.thinking(split.reasoning) + self._answer(split.content)

    def finish(self) -> list[Event]:
        """The output has ended: what was held back, then the last block closed."""
        events: list[Event] = []
        if self.reasoning is not None:
            split = self.reasoning.finish()
            events += self.writer.thinking(split.reasoning) + self._answer(split.content)
        if self.tools is not None:
            events += self.writer.text(self.tools.finish())
        return events + self.writer.close()

    def _answer(self, text: str) -> list[Event]:
        if self.tools is None:
            return self.writer.text(text)
        content, calls = self.tools.feed(text)
        events = self.writer.text(content)
        for call in calls:
            function = call.function
            if call.id is not None and function is not None:
                events += self.writer.tool_use(tool_use_id(call.id), function.name or "")
            if function is not None and function.arguments:
                events += self.writer.tool_input(function.arguments)
        return events

    @property
    def reasoning_tokens(self) -> int:
        return 0 if self.reasoning is None else self.reasoning.reasoning_tokens


def stop_reason(
    finish: str | None, stop: str | int | None, used_tools: bool
) -> tuple[wire.StopReason, str | None]:
    """Anthropic's `stop_reason` and `stop_sequence` for a choice that ended with
    `finish` (the engine's) on `stop` (a stop string or token id)."""
    if finish == "length":
        return "max_tokens", None
    if used_tools:
        return "tool_use", None
    if finish == "stop" and isinstance(stop, str):
        return "stop_sequence", stop
    return "end_turn", None
