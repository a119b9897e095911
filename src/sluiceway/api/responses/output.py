"""A response's output built from the chat shape's streamed deltas, with the
named events of a streamed response in the order OpenAI sends them:

    response.created, response.in_progress (a background one: response.created,
        response.queued, then response.in_progress once it runs),
    per reasoning item: response.output_item.added, response.content_part.added,
        response.reasoning_text.delta..., response.reasoning_text.done,
        response.content_part.done, response.output_item.done
    per message: response.output_item.added, response.content_part.added,
        response.output_text.delta..., response.output_text.done,
        response.content_part.done, response.output_item.done
    per function call: response.output_item.added,
        response.function_call_arguments.delta..., .done, response.output_item.done
    response.completed (or response.incomplete, response.failed)

one item after another: an item's `.done` events all come before the next
item's `response.output_item.added`. The item a cut, abort or failure leaves
open ends with status `incomplete`, in its `output_item.done` and in the output.

Streamed and non-streamed responses go through the same `ResponseOutput`; the
non-streamed one drops the events."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import attrs

from sluiceway import protocol
from sluiceway.protocol.responses import (
    FunctionCallItem,
    OutputMessage,
    OutputText,
    ReasoningItem,
    ReasoningText,
)

Event = dict[str, Any]


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@attrs.define
class _Call:
    index: int  # the chat deltas' tool-call index
    output_index: int
    item_id: str
    call_id: str
    name: str
    arguments: list[str] = attrs.field(factory=list)


# The finish reasons of an output that ended on its own; after any other (cut by
# `max_output_tokens`, aborted, failed) the item still open is incomplete.
_ENDED_WHOLE = ("stop", "tool_calls")


class ResponseOutput:
    """Feeds on `ChatCompletionChunkChoice`s of one choice; `emit` gets each event
    (with its `sequence_number`) as it happens. At most one item is open at a
    time: an item's closing events come before the next item is added."""

    def __init__(self, emit: Callable[[Event], None] | None = None) -> None:
        self._emit_fn = emit
        self._sequence = 0
        self.items: list[protocol.OutputItem] = []
        self._text: list[str] | None = None  # the open message's text
        self._message_id = ""
        self._message_index = 0
        self._call: _Call | None = None  # the open function call
        self._reasoning: list[str] | None = None  # the open reasoning item's text
        self._reasoning_id = ""
        self._reasoning_index = 0
        self.finish_reason: str | None = None

    def emit(self, event_type: str, **fields: Any) -> None:
        if self._emit_fn is not None:
            self._emit_fn({"type": event_type, "sequence_number": self._sequence, **fields})
        self._sequence += 1

    def start(self, response: protocol.Response) -> None:
        snapshot = response.to_dict()
        self.emit("response.created", response=snapshot)
        self.emit("response.in_progress", response=snapshot)

    def queue(self, response: protocol.Response) -> None:
        """The first events of a background response, `response` queued: created and
        queued; `begin` follows once it runs."""
        snapshot = response.to_dict()
        self.emit("response.created", response=snapshot)
        self.emit("response.queued", response=snapshot)

    def begin(self, response: protocol.Response) -> None:
        """A queued response runs now (`response` in progress)."""
        self.emit("response.in_progress", response=response.to_dict())

    def feed(self, choice: protocol.ChatCompletionChunkChoice) -> None:
        delta = choice.delta
        pieces = delta.tool_calls or ()
        # One delta can end a call, then hold text, then start the next call; text
        # is never inside a call, so the open call's pieces come before the text
        # and any new call's after it.
        open_index = None if self._call is None else self._call.index
        if delta.reasoning_content:  # thinking comes before what it leads to
            self._add_reasoning(delta.reasoning_content)
        for piece in pieces:
            if piece.index == open_index:
                self._add_call(piece)
        if delta.content:
            self._add_text(delta.content)
        for piece in pieces:
            if piece.index != open_index:
                self._add_call(piece)
        if choice.finish_reason is not None:
            self.finish_reason = choice.finish_reason

    def _add_reasoning(self, text: str) -> None:
        where = {"item_id": self._reasoning_id, "output_index": self._reasoning_index}
        if self._reasoning is None:
            self._close_text("completed")
            self._close_call("completed")
            self._reasoning, self._reasoning_id = [], _item_id("rs")
            self._reasoning_index = len(self.items)
            where = {"item_id": self._reasoning_id, "output_index": self._reasoning_index}
            item = ReasoningItem(self._reasoning_id, status="in_progress")
            self.emit(
                "response.output_item.added",
                output_index=self._reasoning_index,
                item=item.to_dict(),
            )
            self.emit(
                "response.content_part.added",
                **where,
                content_index=0,
                part=ReasoningText("").to_dict(),
            )
        self._reasoning.append(text)
        self.emit("response.reasoning_text.delta", **where, content_index=0, delta=text)

    def _close_reasoning(self, status: str) -> None:
        if self._reasoning is None:
            return
        text = "".join(self._reasoning)
        self._reasoning = None
        where = {"item_id": self._reasoning_id, "output_index": self._reasoning_index}
        self.emit("response.reasoning_text.done", **where, content_index=0, text=text)
        part = ReasoningText(text)
        self.emit("response.content_part.done", **where, content_index=0, part=part.to_dict())
        item = ReasoningItem(self._reasoning_id, [part], status=status)
        self.items.append(item)
        self.emit(
            "response.output_item.done", output_index=self._reasoning_index, item=item.to_dict()
        )

    def _add_text(self, text: str) -> None:
        if self._text is None:
            self._close_reasoning("completed")
            self._close_call("completed")
            self._text, self._message_id = [], _item_id("msg")
            self._message_index = len(self.items)
            self.emit(
                "response.output_item.added",
                output_index=self._message_index,
                item=OutputMessage(self._message_id, status="in_progress").to_dict(),
            )
            self.emit(
                "response.content_part.added",
                item_id=self._message_id,
                output_index=self._message_index,
                content_index=0,
                part=OutputText("").to_dict(),
            )
        self._text.append(text)
        self.emit(
            "response.output_text.delta",
            item_id=self._message_id,
            output_index=self._message_index,
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def _close_text(self, status: str) -> None:
        if self._text is None:
            return
        text = "".join(self._text)
        self._text = None
        where = {"item_id": self._message_id, "output_index": self._message_index}
        self.emit("response.output_text.done", **where, content_index=0, text=text, logprobs=[])
        part = OutputText(text)
        self.emit("response.content_part.done", **where, content_index=0, part=part.to_dict())
        item = OutputMessage(self._message_id, [part], status)
        self.items.append(item)
        self.emit(
            "response.output_item.done", output_index=self._message_index, item=item.to_dict()
        )

    def _add_call(self, piece: protocol.DeltaToolCall) -> None:
        call = self._call
        function = piece.function or protocol.DeltaFunctionCall()
        if call is None or call.index != piece.index:
            # A call's pieces all come before the next call's: a new index ends the
            # open call, which was complete.
            self._close_reasoning("completed")
            self._close_text("completed")
            self._close_call("completed")
            call = self._call = _Call(
                index=piece.index,
                output_index=len(self.items),
                item_id=_item_id("fc"),
                call_id=piece.id or _item_id("call"),
                name=function.name or "",
            )
            item = FunctionCallItem(call.item_id, call.call_id, call.name, "", "in_progress")
            self.emit(
                "response.output_item.added", output_index=call.output_index, item=item.to_dict()
            )
        if function.arguments:
            call.arguments.append(function.arguments)
            self.emit(
                "response.function_call_arguments.delta",
                item_id=call.item_id,
                output_index=call.output_index,
                delta=function.arguments,
            )

    def _close_call(self, status: str) -> None:
        call, self._call = self._call, None
        if call is None:
            return
        arguments = "".join(call.arguments)
        self.emit(
            "response.function_call_arguments.done",
            item_id=call.item_id,
            output_index=call.output_index,
            name=call.name,
            arguments=arguments,
        )
        item = FunctionCallItem(call.item_id, call.call_id, call.name, arguments, status)
        self.items.append(item)
        self.emit("response.output_item.done", output_index=call.output_index, item=item.to_dict())

    def close(self) -> list[dict[str, Any]]:
        """Ends the open item, incomplete unless the output ended on its own (not cut
        by `max_output_tokens`, aborted or failed); the output's wire form."""
        status = "completed" if self.finish_reason in _ENDED_WHOLE else "incomplete"
        self._close_reasoning(status)
        self._close_text(status)
        self._close_call(status)
        return [item.to_dict() for item in self.items]

    def finish(self, response: protocol.Response) -> None:
        """The last event, for `response` in its final status."""
        kind = {"completed": "completed", "incomplete": "incomplete"}.get(response.status, "failed")
        self.emit(f"response.{kind}", response=response.to_dict())
