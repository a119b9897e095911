"""A response's output built from the chat shape's streamed deltas, with the
named events of a streamed response in the order OpenAI sends them:

    response.created, response.in_progress (a background one: response.created,
        response.queued, then response.in_progress once it runs),
    per message: response.output_item.added, response.content_part.added,
        response.output_text.delta..., response.output_text.done,
        response.content_part.done, response.output_item.done
    per function call: response.output_item.added,
        response.function_call_arguments.delta..., .done, response.output_item.done
    response.completed (or response.incomplete, response.failed)

Streamed and non-streamed responses go through the same `ResponseOutput`; the
non-streamed one drops the events."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import attrs

from sluiceway import protocol
from sluiceway.protocol.responses import FunctionCallItem, OutputMessage, OutputText

Event = dict[str, Any]


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@attrs.define
class _Call:
    output_index: int
    item_id: str
    call_id: str
    name: str
    arguments: list[str] = attrs.field(factory=list)


class ResponseOutput:
    """Feeds on `ChatCompletionChunkChoice`s of one choice; `emit` gets each event
    (with its `sequence_number`) as it happens."""

    def __init__(self, emit: Callable[[Event], None] | None = None) -> None:
        self._emit_fn = emit
        self._sequence = 0
        self.items: list[protocol.OutputItem] = []
        self._text: list[str] | None = None  # the open message's text
        self._message_id = ""
        self._message_index = 0
        self._calls: dict[int, _Call] = {}
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
        if delta.content:
            self._add_text(delta.content)
        for call in delta.tool_calls or ():
            self._add_call(call)
        if choice.finish_reason is not None:
            self.finish_reason = choice.finish_reason

    def _add_text(self, text: str) -> None:
        if self._text is None:
            self._close_calls()
            self._text, self._message_id = [], _item_id("msg")
            self._message_index = len(self.items) + len(self._calls)
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

    def _close_text(self) -> None:
        if self._text is None:
            return
        text = "".join(self._text)
        self._text = None
        where = {"item_id": self._message_id, "output_index": self._message_index}
        self.emit("response.output_text.done", **where, content_index=0, text=text, logprobs=[])
        part = OutputText(text)
        self.emit("response.content_part.done", **where, content_index=0, part=part.to_dict())
        item = OutputMessage(self._message_id, [part])
        self.items.append(item)
        self.emit(
            "response.output_item.done", output_index=self._message_index, item=item.to_dict()
        )

    def _add_call(self, piece: protocol.DeltaToolCall) -> None:
        call = self._calls.get(piece.index)
        function = piece.function or protocol.DeltaFunctionCall()
        if call is None:
            self._close_text()
            call = self._calls[piece.index] = _Call(
                output_index=len(self.items) + len(self._calls),
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

    def _close_calls(self) -> None:
        for call in self._calls.values():
            arguments = "".join(call.arguments)
            self.emit(
                "response.function_call_arguments.done",
                item_id=call.item_id,
                output_index=call.output_index,
                name=call.name,
                arguments=arguments,
            )
            item = FunctionCallItem(call.item_id, call.call_id, call.name, arguments)
            self.items.append(item)
            self.emit(
                "response.output_item.done", output_index=call.output_index, item=item.to_dict()
            )
        self._calls = {}

    def close(self) -> list[dict[str, Any]]:
        """Ends the open items; the output's wire form."""
        self._close_text()
        self._close_calls()
        return [item.to_dict() for item in self.items]

    def finish(self, response: protocol.Response) -> None:
        """The last event, for `response` in its final status."""
        kind = {"completed": "completed", "incomplete": "incomplete"}.get(response.status, "failed")
        self.emit(f"response.{kind}", response=response.to_dict())
