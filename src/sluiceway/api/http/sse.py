"""Server-sent events as the OpenAI streaming API writes them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sluiceway.api.http.json_body import encode_json

DONE = b"data: [DONE]\n\n"
HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    # Tell proxies (nginx) not to buffer the stream.
    "X-Accel-Buffering": "no",
}



def event(obj: Any) -> bytes:
    """One `data: <json>` event. JSON never holds a raw newline, so one line suffices."""
    return b"data: " + encode_json(obj).encode("utf-8") + b"\n\n"


def named_event(name: str, obj: Any) -> bytes:
    """One `event: <name>` event with its `data: <json>` (the Responses API's)."""
    return b"event: " + name.encode("ascii") + b"\n" + event(obj)


class EventTemplate:
    """The `event` of an object in which one string varies, encoded once around it.

    `render(text)` gives exactly `event(build(text))`: the bytes before and after the
    string are the same for every text, and the text is escaped by the same encoder.
    A streamed chunk that carries nothing but a token's text then costs one string
    escape and two joins, where building its dicts and encoding them was a sizeable
    share of the event loop's work per token (`docs/benchmarks.md`)."""

    # Control characters are escaped in JSON, so this cannot come from the encoder
    # writing anything but this string.
    _HOLE = "\x00sluiceway-event-template\x00"

    def __init__(self, before: bytes, after: bytes) -> None:
        """Use `around`."""
        self._before = before
        self._after = after

    @classmethod
    def around(cls, build: Callable[[str], Any]) -> EventTemplate | None:
        """The template of `event(build(text))`, or None when the encoded object does not
        hold `text` exactly once as a whole string (then encode each event instead).
        `build` must place its argument in the object unchanged."""
        parts = event(build(cls._HOLE)).split(encode_json(cls._HOLE).encode("utf-8"))
        if len(parts) != 2:
            return None
        return cls(*parts)

    def render(self, text: str) -> bytes:
        """`event(build(text))`, byte for byte."""
        return self._before + encode_json(text).encode("utf-8") + self._after
