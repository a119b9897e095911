"""Server-sent events as the OpenAI streaming API writes them."""

from __future__ import annotations

import json
from typing import Any

DONE = b"data: [DONE]\n\n"
HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    # Tell proxies (nginx) not to buffer the stream.
    "X-Accel-Buffering": "no",
}


# Built once: `json.dumps` with options builds a new encoder per call, which was
# half of the 5 µs it took per streamed chunk.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dumps(obj: Any) -> str:
    """Compact JSON; raises ValueError for NaN or infinity, TypeError for other objects."""
    return _ENCODER.encode(obj)


def event(obj: Any) -> bytes:
    """One `data: <json>` event. JSON never holds a raw newline, so one line suffices."""
    return b"data: " + dumps(obj).encode("utf-8") + b"\n\n"
