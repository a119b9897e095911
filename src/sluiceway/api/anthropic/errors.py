"""Errors on the Messages API's paths in Anthropic's shape,
`{"type": "error", "error": {"type": ..., "message": ...}}`, with the same status
codes as everywhere else: the app writes every error under `ANTHROPIC_PREFIX` so,
whether a route, the authentication hook or the HTTP layer raised it."""

from __future__ import annotations

import re
from typing import Any

from sluiceway.api.http.errors import APIError
from sluiceway.protocol.anthropic import ErrorResponse

ANTHROPIC_PREFIX = "/v1/messages"

# A Messages request is checked as the chat request it becomes: the chat fields
# an error may name, as the Messages request names them.
_FIELDS = (
    (re.compile(r"\.function\.parameters\b"), ".input_schema"),
    (re.compile(r"\.function\.name\b"), ".name"),
    (re.compile(r"^stop\b"), "stop_sequences"),
)


def messages_param(param: str) -> str:
    """The Messages request's name for a chat request's field `param`."""
    for pattern, name in _FIELDS:
        param = pattern.sub(name, param)
    return param


def anthropic_error_body(error: APIError) -> dict[str, Any]:
    """`error` as Anthropic writes an error of its status; the parameter, where
    one is named, leads the message (Anthropic's errors have no field for it)."""
    message = error.message
    if error.param:
        param = messages_param(error.param)
        if error.param not in message and param not in message:
            message = f"{param}: {message}"
    return ErrorResponse.for_status(error.status, message).to_dict()
