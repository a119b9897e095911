"""A batch's input file read into its lines, as OpenAI checks one: every line a
JSON object with a unique `custom_id`, `method` POST, the batch's `url` and a
`body` object. What is wrong is reported per line (1-based), as the errors of a
batch that failed validation.

Lines are read by the same decoder as request bodies (`wire.read_json`), with
the same limits, and each line's body is kept as the bytes the file holds: when
it runs, its endpoint decodes exactly what an HTTP request with that body would
send. A body that is not JSON to that endpoint refuses the batch here, with the
line; one that is JSON but not a valid request is answered when it runs, as the
endpoint answers it."""

from __future__ import annotations

from typing import Any

import attrs
import msgspec

from sluiceway import protocol
from sluiceway.api.batches.store import BatchLine
from sluiceway.api.http.wire import MAX_JSON_DEPTH, NotJSON, error_param, json_problem, read_json
from sluiceway.protocol.batches import BatchError

MAX_BATCH_LINES = 50_000
"""Requests one batch may hold, as OpenAI allows."""

# The type each endpoint decodes its body into: a line's body is checked by the
# very call its endpoint makes, so that the two verdicts cannot differ.
_BODY_TYPES: dict[str, Any] = {
    "/v1/chat/completions": protocol.ChatCompletionRequest,
    "/v1/completions": protocol.CompletionRequest,
    "/v1/embeddings": protocol.EmbeddingRequest,
}


_NO_BODY = msgspec.Raw()


@attrs.frozen
class _Line:
    """A line as decoded: the fields checked here as they came, the body as its
    bytes (empty when the line has none)."""

    custom_id: Any = None
    method: Any = None
    url: Any = None
    body: msgspec.Raw = _NO_BODY


# Per-field codes for a value msgspec refuses outright (a number out of range).
_FIELD_CODES = {
    "custom_id": "missing_custom_id",
    "method": "invalid_method",
    "url": "mismatched_url",
}


def read_lines(
    content: bytes, endpoint: str, max_body_bytes: int | None = None
) -> tuple[list[BatchLine], list[BatchError]]:
    """The lines of `content` for a batch against `endpoint`, or the errors that
    refuse it (then the lines are incomplete). Blank lines are skipped; a body
    over `max_body_bytes` is refused as the same request over HTTP would be."""
    lines: list[BatchLine] = []
    errors: list[BatchError] = []
    seen: set[str] = set()
    body_type = _BODY_TYPES.get(endpoint, Any)
    # Only "\n" ends a line: JSON strings may hold U+2028 and the like raw. In
    # UTF-8 no other character holds the byte 0x0A, so bytes split as text would.
    for number, raw in enumerate(content.split(b"\n"), start=1):
        raw = raw.removesuffix(b"\r")
        if not raw.strip(b" \t\r"):
            continue
        checked = _check(raw, number, endpoint, seen, body_type, max_body_bytes)
        if isinstance(checked, BatchError):
            errors.append(checked)
            if len(errors) >= 100:  # enough to show what is wrong
                break
            continue
        custom_id, body = checked
        seen.add(custom_id)
        lines.append(BatchLine(len(lines), custom_id, body))
    if not lines and not errors:
        errors.append(BatchError("empty_file", "The file holds no requests."))
    if len(lines) > MAX_BATCH_LINES:
        errors.append(
            BatchError("too_many_requests", f"A batch may hold at most {MAX_BATCH_LINES} requests.")
        )
    return lines, errors


def _decode(raw: bytes, number: int) -> BatchError | _Line:
    try:
        # The body sits one level inside the line: the line may nest one deeper.
        line: _Line = read_json(raw, _Line, MAX_JSON_DEPTH + 1)
    except NotJSON as exc:
        return BatchError("invalid_json", f"This line is not valid JSON: {exc}.", number)
    except msgspec.ValidationError as exc:
        _, path = error_param(str(exc))
        if path is None:
            return BatchError("invalid_request", "This line is not a JSON object.", number)
        field = path.split(".")[0].split("[")[0]
        code = _FIELD_CODES.get(field, "invalid_request")
        return BatchError(code, f"Invalid '{path}' in this line: {exc}.", number, field)
    return line


def _check(
    raw: bytes,
    number: int,
    endpoint: str,
    seen: set[str],
    body_type: Any,
    max_body_bytes: int | None,
) -> BatchError | tuple[str, str]:
    line = _decode(raw, number)
    if isinstance(line, BatchError):
        return line
    custom_id = line.custom_id
    if not isinstance(custom_id, str) or not custom_id:
        return BatchError(
            "missing_custom_id", "Each line needs a custom_id string.", number, "custom_id"
        )
    if custom_id in seen:
        return BatchError(
            "duplicate_custom_id",
            f"The custom_id {custom_id!r} is used twice.",
            number,
            "custom_id",
        )
    if line.method != "POST":
        return BatchError("invalid_method", "The method must be POST.", number, "method")
    if line.url != endpoint:
        return BatchError(
            "mismatched_url", f"The url must be the batch's endpoint, {endpoint}.", number, "url"
        )
    body = bytes(line.body)
    if not body.startswith(b"{"):  # msgspec.Raw holds the value alone, no whitespace
        return BatchError("invalid_body", "The body must be a JSON object.", number, "body")
    if max_body_bytes is not None and len(body) > max_body_bytes:
        return BatchError(
            "request_too_large",
            f"The body is {len(body)} bytes; the limit is {max_body_bytes} bytes "
            "(raise it with --max-body-size).",
            number,
            "body",
        )
    problem = json_problem(body, body_type)
    if problem is not None:
        return BatchError("invalid_json", f"The body is not valid JSON: {problem}.", number, "body")
    # The line was UTF-8, so its body is: stored as text, it encodes back to these bytes.
    return custom_id, body.decode("utf-8")
