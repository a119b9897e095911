"""The error body every endpoint answers with: `{"error": {...}}`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import msgspec

from sluiceway.protocol._codec import JSON, Wire, decode, encode


@attrs.frozen
class ErrorObject(Wire):
    """The body of an OpenAI error response: ``{"error": {...}}``."""

    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | int | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ErrorObject:
        """Accepts either the inner object or the whole ``{"error": {...}}`` body."""
        inner = d.get("error", d)
        if isinstance(inner, str):  # some servers send {"error": "text"}
            return cls(message=inner, type="error")
        if inner.get("type") is None:  # a server's error without a type
            inner = {**inner, "type": "error"}
        try:
            return decode(cls, inner)
        except msgspec.ValidationError:  # still an error: keep what it says
            return cls(message=str(inner.get("message", "")), type="error")

    def to_dict(self) -> JSON:
        """The whole response body, ``{"error": {...}}``."""
        return {"error": encode(self)}
