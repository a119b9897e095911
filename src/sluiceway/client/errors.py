"""Exceptions raised by the client. Every one carries an OpenAI error object.

Hierarchy::

    APIError                      base; ``.error`` is an ErrorObject
    ├── APIConnectionError        could not connect / connection lost before a response
    ├── APITimeoutError           a trio deadline (the client's ``timeout``) expired
    ├── ResponseFormatError       the server sent something that is not the OpenAI format
    ├── StreamInterruptedError    a stream ended (or the connection broke) without [DONE]
    ├── APIStreamError            the server sent an error event inside a stream
    └── APIStatusError            an HTTP error status; ``.status_code``, ``.headers``
        ├── BadRequestError           400
        ├── AuthenticationError       401
        ├── PermissionDeniedError     403
        ├── NotFoundError             404
        ├── PayloadTooLargeError      413
        ├── UnprocessableEntityError  422
        ├── RateLimitedError          429 (retried)
        ├── InternalServerError       500 and other 5xx
        └── ServerUnavailableError    503 (retried)
"""

from __future__ import annotations

from collections.abc import Mapping

import trio

from sluiceway.client._retry import parse_retry_after
from sluiceway.protocol import ErrorObject

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIStatusError",
    "APIStreamError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "InternalServerError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitError",
    "RateLimitedError",
    "ResponseFormatError",
    "ServerUnavailableError",
    "StreamInterruptedError",
    "UnprocessableEntityError",
    "status_error",
]


class APIError(Exception):
    """Base class. ``error`` is the OpenAI error object (made up locally when the
    failure happened on this side), ``message`` its message."""

    default_type = "api_error"

    def __init__(self, message: str, *, error: ErrorObject | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.error = error if error is not None else ErrorObject(message, self.default_type)


class APIConnectionError(APIError):
    default_type = "connection_error"


class APITimeoutError(APIError, trio.TooSlowError):
    """The call's trio deadline expired. Also a ``trio.TooSlowError``."""

    default_type = "timeout"


class ResponseFormatError(APIError):
    default_type = "invalid_response"


class StreamInterruptedError(APIError):
    """The stream ended before ``data: [DONE]``: the answer is incomplete."""

    default_type = "stream_interrupted"


class APIStreamError(APIError):
    """The server reported an error inside an already started stream."""


class APIStatusError(APIError):
    """An HTTP error status. ``status_code``, ``headers`` (lower-cased names)."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        error: ErrorObject | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message, error=error)
        self.status_code = status_code
        self.headers = dict(headers or {})

    def __str__(self) -> str:
        return f"HTTP {self.status_code}: {self.message}"


class BadRequestError(APIStatusError):
    pass


class AuthenticationError(APIStatusError):
    pass


class PermissionDeniedError(APIStatusError):
    pass


class NotFoundError(APIStatusError):
    pass


class PayloadTooLargeError(APIStatusError):
    pass


class UnprocessableEntityError(APIStatusError):
    pass


class RateLimitedError(APIStatusError):
    """429. ``retry_after`` is the server's Retry-After in seconds, if it sent one."""

    @property
    def retry_after(self) -> float | None:
        return parse_retry_after(self.headers.get("retry-after"))


RateLimitError = RateLimitedError  # the openai package's name


class InternalServerError(APIStatusError):
    pass


class ServerUnavailableError(InternalServerError):
    """503: the server is draining or overloaded."""

    @property
    def retry_after(self) -> float | None:
        return parse_retry_after(self.headers.get("retry-after"))


_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    413: PayloadTooLargeError,
    422: UnprocessableEntityError,
    429: RateLimitedError,
    503: ServerUnavailableError,
}


def status_error(
    status_code: int, error: ErrorObject, headers: Mapping[str, str] | None = None
) -> APIStatusError:
    """The typed exception for an HTTP error status."""
    cls = _BY_STATUS.get(status_code)
    if cls is None:
        cls = InternalServerError if status_code >= 500 else APIStatusError
    return cls(error.message, status_code=status_code, error=error, headers=headers)
