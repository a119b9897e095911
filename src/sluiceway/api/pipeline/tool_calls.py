"""A choice's output text -> content and tool calls, as it streams and at its end.

Calls are written `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
(the grammar of `sluiceway.grammar.spec.tool_calls` enforces exactly this form, so
the name always comes first). One parser serves both paths: a streamed choice
feeds it each delta's text; a full response feeds it the whole text at once.

Streaming follows OpenAI: a call's first delta carries its `index`, `id`, `type`
and name, and whatever start of its `arguments` came with them; the next ones,
fragments of its `arguments` which join into the exact JSON text. One `feed`
gives at most one delta per call. Text that might be the start of a tag, or the
end of a call, is held back until the next text says which it is.
"""

from __future__ import annotations

import json
import re
import uuid

import attrs

from sluiceway import protocol
from sluiceway.grammar.spec import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

_HEAD = re.compile(r'\n\{"name": ("(?:[^"\\]|\\.)*"), "arguments": ')
_TAIL = "}\n" + TOOL_CALL_CLOSE  # closes the call object and its tag


def _held_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that begins `marker` (could still become it)."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


@attrs.define
class ParsedCall:
    id: str
    name: str
    arguments: str = ""  # the arguments sent so far; all of them once `complete`
    complete: bool = False


@attrs.define
class ToolCallParser:
    """Splits one choice's text into content and calls. Owned by one consumer."""

    content: list[str] = attrs.field(factory=list)
    calls: list[ParsedCall] = attrs.field(factory=list)
    _pending: str = ""  # text not yet given out
    _in_call: bool = False

    def feed(self, text: str) -> tuple[str, list[protocol.DeltaToolCall]]:
        """The content and call deltas that `text` (the next piece of output) makes
        certain; the rest waits for later text or `finish`."""
        self._pending += text
        content: list[str] = []
        deltas: list[protocol.DeltaToolCall] = []
        while self._pending:
            if not self._in_call:
                if not self._outside(content):
                    break
            elif not self._inside(deltas):
                break
        self.content.extend(content)
        return "".join(content), deltas

    def _outside(self, content: list[str]) -> bool:
        start = self._pending.find(TOOL_CALL_OPEN)
        if start < 0:
            keep = _held_suffix(self._pending, TOOL_CALL_OPEN)
            if self.calls:  # the newline before a next call is not content either
                keep = max(keep, _held_suffix(self._pending, "\n" + TOOL_CALL_OPEN))
            content.append(self._pending[: len(self._pending) - keep])
            self._pending = self._pending[len(self._pending) - keep :]
            return False
        # Calls follow one another a newline apart; that newline is not content.
        before = self._pending[:start]
        if self.calls and before == "\n":
            before = ""
        content.append(before)
        self._pending = self._pending[start + len(TOOL_CALL_OPEN) :]
        self._in_call = True
        return True

    def _inside(self, deltas: list[protocol.DeltaToolCall]) -> bool:
        index = len(self.calls) - 1
        opened = not self.calls or self.calls[-1].complete
        if opened:
            head = _HEAD.match(self._pending)
            if head is None:
                return False  # the name is not all here yet
            self.calls.append(ParsedCall(f"call_{uuid.uuid4().hex[:24]}", json.loads(head[1])))
            index += 1
            self._pending = self._pending[head.end() :]
        call = self.calls[index]
        end = self._pending.find(_TAIL)
        if end >= 0:
            piece, self._pending = self._pending[:end], self._pending[end + len(_TAIL) :]
            call.complete = True
            self._in_call = False
        else:
            keep = _held_suffix(self._pending, _TAIL)
            piece = self._pending[: len(self._pending) - keep]
            self._pending = self._pending[len(self._pending) - keep :]
        call.arguments += piece
        # One entry per call per chunk, as OpenAI sends: the openai SDK's stream
        # accumulator and instructor's partials lose a second entry for an index.
        # `feed` comes here once per call: it stops at a call still open and goes
        # on past one only once it is complete.
        if opened:
            deltas.append(
                protocol.DeltaToolCall(
                    index, call.id, "function", protocol.DeltaFunctionCall(call.name, piece)
                )
            )
        elif piece:
            deltas.append(
                protocol.DeltaToolCall(index, function=protocol.DeltaFunctionCall(arguments=piece))
            )
        return call.complete

    @property
    def in_call(self) -> bool:
        """Inside a call not yet complete."""
        return self._in_call

    def finish(self) -> str:
        """The output has ended: text still held back outside a call is content."""
        rest = "" if self._in_call else self._pending
        self._pending = ""
        self.content.append(rest)
        return rest

    def complete_calls(self) -> list[protocol.ToolCall]:
        return [
            protocol.ToolCall(c.id, protocol.FunctionCall(c.name, c.arguments))
            for c in self.calls
            if c.complete
        ]


def parse(text: str) -> tuple[str | None, list[protocol.ToolCall]]:
    """A whole output's content and its complete calls. With calls, the content is
    the text around them, stripped, or None when there is none. A call the output
    ended inside (cut by its length limit) is not returned; when it was the only
    one, all of the output is content."""
    parser = ToolCallParser()
    parser.feed(text)
    parser.finish()
    calls = parser.complete_calls()
    if not calls:
        return (text if parser.in_call else "".join(parser.content)), []
    return "".join(parser.content).strip() or None, calls
