"""The error body every endpoint answers with: `{"error": {...}}`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from sluiceway.protocol._codec import JSON


@attrs.frozen
class ErrorObject:
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
        return cls(
            message=str(inner.get("message", "")),
            type=str(inner.get("type") or "error"),
            param=inner.get("param"),
            code=inner.get("code"),
        )

    def to_dict(self) -> JSON:
        """The whole response body, ``{"error": {...}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }
