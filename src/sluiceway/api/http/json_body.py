"""JSON bodies as the API writes them: compact, UTF-8, no NaN or infinity."""

from __future__ import annotations

import json
from typing import Any

from quart import Response

# Built once: `json.dumps` with options builds a new encoder on every call, and
# every streamed chunk goes through this.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def encode_json(obj: Any) -> str:
    """Compact JSON; raises ValueError for NaN or infinity, TypeError for other objects."""
    return _ENCODER.encode(obj)


def json_response(obj: Any, status: int = 200) -> Response:
    """`obj` as an `application/json` response with `status`."""
    return Response(encode_json(obj), status=status, content_type="application/json")
