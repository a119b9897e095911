"""OpenAI-style error objects and the exception that carries one to the client.

Every error the HTTP layer returns, streaming or not, has the shape
`{"error": {"message", "type", "param", "code"}}` that the official `openai`
client parses.
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.define(eq=False)  # not frozen: the runtime sets __traceback__/__notes__ on raise
class APIError(Exception):
    """An error answer: HTTP status, OpenAI error type/code, offending parameter.

    Raised anywhere below a route handler; the app turns it into a JSON response
    with `status` and any extra `headers` (e.g. `Retry-After`).
    """

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    headers: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(
    message: str, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def unauthorized() -> APIError:
    return APIError(
        401,
        "Incorrect or missing API key; send it as `Authorization: Bearer <key>`.",
        "authentication_error",
        None,
        "invalid_api_key",
    )


def not_found(kind: str, object_id: str, param: str) -> APIError:
    """The 404 for an unknown id of a `kind` of object, naming `param`."""
    return APIError(
        404, f"No {kind} found with id '{object_id}'.", "invalid_request_error", param, "not_found"
    )


def response_not_found(response_id: str) -> APIError:
    return not_found("response", response_id, "response_id")


def model_not_found(name: str) -> APIError:
    return APIError(
        404,
        f"The model `{name}` does not exist.",
        "invalid_request_error",
        "model",
        "model_not_found",
    )


def queue_full(retry_after_s: int = 1) -> APIError:
    return APIError(
        429,
        "The server's request queue is full; retry later.",
        "rate_limit_error",
        None,
        "queue_full",
        (("Retry-After", str(retry_after_s)),),
    )


def unavailable(message: str, code: str) -> APIError:
    return APIError(503, message, "service_unavailable_error", None, code)


def draining() -> APIError:
    return unavailable("The server is shutting down and accepts no new requests.", "draining")


def engine_unhealthy(detail: str | None = None) -> APIError:
    message = "The inference engine is unavailable"
    return unavailable(f"{message}: {detail}" if detail else f"{message}.", "engine_unhealthy")


def timeout(seconds: float | None) -> APIError:
    limit = f" of {seconds:g} s" if seconds is not None else ""
    return APIError(
        504,
        f"The request exceeded the server's request timeout{limit}.",
        "timeout_error",
        None,
        "request_timeout",
    )


def body_too_large(limit: int, size: int | None) -> APIError:
    """The 413 for a request body over `--max-body-size`; `size` is None when only
    the part that arrived is known (a chunked body, cut off at the limit). The rest
    of the body is not read, so the connection closes after the answer."""
    flag = "(raise it with --max-body-size)"
    if size is None:
        message = f"The request body exceeds the limit of {limit} bytes {flag}."
    else:
        message = f"The request body is {size} bytes; the limit is {limit} bytes {flag}."
    return APIError(
        413, message, "invalid_request_error", None, "request_too_large", (("Connection", "close"),)
    )


def too_many_form_parts(limit: int) -> APIError:
    """The 413 for a multipart upload of more than `limit` parts: quart's bound on
    the parsing one form may cost, apart from its size."""
    return APIError(
        413,
        f"The upload has more than {limit} form parts; it needs only 'file' and 'purpose'.",
        "invalid_request_error",
        None,
        "request_too_large",
        (("Connection", "close"),),
    )
