"""Errors on the Messages API's paths in Anthropic's shape,
`{"type": "error", "error": {"type": ..., "message": ...}}`, with the same status
codes as everywhere else: the app writes every error under `ANTHROPIC_PREFIX` so,
whether a route, the authentication hook or the HTTP layer raised it."""

from __future__ import annotations

from typing import Any

from sluiceway.api.http.errors import APIError
from sluiceway.protocol.anthropic import ErrorResponse

ANTHROPIC_PREFIX = "/v1/messages"


def anthropic_error_body(error: APIError) -> dict[str, Any]:
    """`error` as Anthropic writes an error of its status; the parameter, where
    one is named, leads the message (Anthropic's errors have no field for it)."""
    message = error.message
    if error.param and error.param not in message:
        message = f"{error.param}: {message}"
    return ErrorResponse.for_status(error.status, message).to_dict()
