"""Request bytes (or decoded JSON) -> the typed request of `sluiceway.protocol`.

msgspec decodes and checks the structure and every range the types state, in one
pass over the bytes; a failure is a 400 whose `param` is the JSON path of the
offending value (`messages[2].content`), with msgspec's own description.

Whether bytes are JSON at all is decided here once, for every way a body arrives:
an HTTP request's body and a Batch API line's body go through `read_json`, so the
same bytes get the same verdict on either route.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from sluiceway.api.http.errors import APIError, invalid_request

T = TypeVar("T")

# msgspec ends a message with where the value was: " - at `$.a[0].b`", or for a
# dict key " - at `key` in `$.a`".
_WHERE = re.compile(r" - at `(?:key` in `)?\$\.?(?P<path>[^`]*)`$")
_MISSING_FIELD = re.compile(r"^Object missing required field `(?P<field>[^`]+)`")

# Decoders are built once per type: building one compiles the type's description.
_DECODERS: dict[Any, msgspec.json.Decoder[Any]] = {Any: msgspec.json.Decoder()}
_ANY = _DECODERS[Any]
_SYNTAX = msgspec.json.Decoder(msgspec.Raw)

MAX_JSON_DEPTH = 512
"""How deep a body may nest arrays and objects. msgspec's own bound is Python's
recursion limit less the frames already on the stack, which differ between the
event loop, a worker thread and a batch line; this one is the same everywhere,
and far enough below that msgspec never reaches its own."""

_TOO_DEEP = f"arrays and objects nested deeper than {MAX_JSON_DEPTH} levels"
# A JSON string, escapes included: its brackets are text, not nesting.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_OPEN_CLOSE = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class NotJSON(ValueError):
    """Bytes that are not JSON at all; the message says what is wrong (with a
    byte offset into those bytes where msgspec gives one)."""


def nested_deeper_than(data: bytes, limit: int) -> bool:
    """Whether JSON text `data` nests arrays and objects more than `limit` deep.
    Brackets inside strings do not count; in broken JSON they may."""
    # Nesting needs at least as many brackets as levels: counting them is a pass
    # at memory speed, and almost every body stops there.
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    depth = 0
    for byte in _STRING.sub(b"", data).translate(_OPEN_CLOSE, _NOT_BRACKETS):
        depth += 1 if byte == 0x5B else -1
        if depth > limit:
            return True
    return False


def _decoder(type: Any) -> msgspec.json.Decoder[Any]:
    decoder = _DECODERS.get(type)
    if decoder is None:
        decoder = _DECODERS[type] = msgspec.json.Decoder(type)
    return decoder


def _check_json(data: bytes, max_depth: int) -> None:
    """Raises `NotJSON` unless `data` reads as JSON, whatever its values."""
    if nested_deeper_than(data, max_depth):
        raise NotJSON(_TOO_DEEP)
    try:
        # Decoding into Raw checks the syntax alone, as msgspec does for a field
        # it skips: plain decoding would stop at a number out of range, before
        # broken JSON after it.
        _SYNTAX.decode(data)
    except msgspec.DecodeError as exc:
        raise NotJSON(str(exc)) from None
    except RecursionError:
        raise NotJSON(_TOO_DEEP) from None


def read_json(body: bytes | str, type: Any, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`body` decoded as a `type`. Raises `NotJSON` when it is not JSON at all: not
    UTF-8, broken syntax, a lone UTF-16 surrogate escape, NaN or Infinity, or
    nesting deeper than `max_depth`; else `msgspec.ValidationError` when `type`
    refuses a value (a number out of float range included)."""
    # A str from Python may hold lone surrogates: encoded as they are, they are not UTF-8.
    data = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    if not data.isascii():
        # msgspec checks the strings it decodes, not those it skips (unknown fields).
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise NotJSON(f"invalid UTF-8 at byte {exc.start}") from None
    try:
        value = _decoder(type).decode(data)
    except msgspec.ValidationError:
        # msgspec stops at the first value `type` refuses; broken JSON after it
        # is what the body is refused for, on any route and whatever the type.
        _check_json(data, max_depth)
        raise
    except msgspec.DecodeError as exc:
        raise NotJSON(str(exc)) from None
    except RecursionError:
        raise NotJSON(_TOO_DEEP) from None
    if nested_deeper_than(data, max_depth):
        raise NotJSON(_TOO_DEEP)
    return value


def json_problem(body: bytes, type: Any) -> str | None:
    """Why `decode(body, type)` would refuse `body` as not JSON, or None when
    `body` is JSON (whether or not `type` accepts its values)."""
    try:
        read_json(body, type)
    except NotJSON as exc:
        return str(exc)
    except msgspec.ValidationError:
        pass
    return None


def error_param(message: str) -> tuple[str, str | None]:
    """msgspec's description of a validation error, split into what is wrong and
    the JSON path it names (None for the whole body)."""
    path: str | None = None
    match = _WHERE.search(message)
    if match:
        message = message[: match.start()]
        # A value in a mapping (`logit_bias[...]`): msgspec does not say which key,
        # so the mapping is the parameter named.
        path = match["path"].split("[...]")[0] or None
    missing = _MISSING_FIELD.match(message)
    if missing:
        path = f"{path}.{missing['field']}" if path else missing["field"]
    return message, path


def _join(prefix: str | None, path: str | None) -> str | None:
    if not prefix or not path:
        return prefix or path
    return prefix + (path if path.startswith("[") else f".{path}")


def _validation_error(exc: msgspec.ValidationError, prefix: str | None) -> APIError:
    message, path = error_param(str(exc))
    path = _join(prefix, path)
    if path is None:
        return invalid_request(f"The request body must be a JSON object: {message}.")
    return invalid_request(f"Invalid '{path}': {message}.", path)


def not_json(problem: str) -> APIError:
    return invalid_request(f"The request body is not valid JSON: {problem}")


def decode(body: bytes | str | Any, type: type[T], prefix: str | None = None) -> T:
    """`body` as a `type`: raw JSON (bytes or str) is decoded (`read_json`), anything
    else is taken as decoded JSON. Raises a 400 `APIError` for invalid JSON or a
    value `type` does not accept; `prefix` is the path of `body` within the
    request, for the error's `param`."""
    try:
        if isinstance(body, bytes | str):
            return read_json(body, type)
        return msgspec.convert(body, type, str_keys=True)
    except msgspec.ValidationError as exc:
        raise _validation_error(exc, prefix) from None
    except NotJSON as exc:
        raise not_json(str(exc)) from None
    except RecursionError:
        raise not_json(_TOO_DEEP) from None


def parse_json(data: bytes | str) -> Any:
    """Decode a request body as plain JSON; invalid JSON, non-UTF-8 or a lone
    surrogate is a 400."""
    try:
        return read_json(data, Any)
    except NotJSON as exc:
        raise not_json(str(exc)) from None
    except msgspec.ValidationError as exc:
        raise invalid_request(f"The request body holds a value out of range: {exc}") from None
