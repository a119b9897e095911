"""A batch's input file read into its lines, as OpenAI checks one: every line a
JSON object with a unique `custom_id`, `method` POST, the batch's `url` and a
`body` object. What is wrong is reported per line (1-based), as the errors of a
batch that failed validation; the requests themselves are checked when they run."""

from __future__ import annotations

import json
from typing import Any

from sluiceway.api.batch_store import BatchLine
from sluiceway.protocol.batches import BatchError

MAX_BATCH_LINES = 50_000
"""Requests one batch may hold, as OpenAI allows."""


def read_lines(content: bytes, endpoint: str) -> tuple[list[BatchLine], list[BatchError]]:
    """The lines of `content` for a batch against `endpoint`, or the errors that
    refuse it (then the lines are incomplete). Blank lines are skipped."""
    lines: list[BatchLine] = []
    errors: list[BatchError] = []
    seen: set[str] = set()
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        return [], [BatchError("invalid_file", "The file is not UTF-8 text.")]
    # Only "\n" ends a line: JSON strings may hold U+2028 and the like raw, which
    # str.splitlines would cut at.
    for number, raw in enumerate(text.split("\n"), start=1):
        raw = raw.removesuffix("\r")
        if not raw.strip():
            continue
        checked = _check(raw, number, endpoint, seen)
        if isinstance(checked, BatchError):
            errors.append(checked)
            if len(errors) >= 100:  # enough to show what is wrong
                break
            continue
        custom_id, body = checked
        seen.add(custom_id)
        lines.append(BatchLine(len(lines), custom_id, json.dumps(body)))
    if not lines and not errors:
        errors.append(BatchError("empty_file", "The file holds no requests."))
    if len(lines) > MAX_BATCH_LINES:
        errors.append(
            BatchError("too_many_requests", f"A batch may hold at most {MAX_BATCH_LINES} requests.")
        )
    return lines, errors


def _check(raw: str, number: int, endpoint: str, seen: set[str]) -> BatchError | tuple[str, Any]:
    try:
        item = json.loads(raw)
    except ValueError:
        return BatchError("invalid_json", "This line is not valid JSON.", number)
    if not isinstance(item, dict):
        return BatchError("invalid_request", "This line is not a JSON object.", number)
    custom_id = item.get("custom_id")
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
    if item.get("method") != "POST":
        return BatchError("invalid_method", "The method must be POST.", number, "method")
    if item.get("url") != endpoint:
        return BatchError(
            "mismatched_url", f"The url must be the batch's endpoint, {endpoint}.", number, "url"
        )
    body = item.get("body")
    if not isinstance(body, dict):
        return BatchError("invalid_body", "The body must be a JSON object.", number, "body")
    return custom_id, body
