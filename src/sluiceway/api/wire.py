"""Request bytes (or decoded JSON) -> the typed request of `sluiceway.protocol`.

msgspec decodes and checks the structure and every range the types state, in one
pass over the bytes; a failure is a 400 whose `param` is the JSON path of the
offending value (`messages[2].content`), with msgspec's own description.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from sluiceway.api.errors import APIError, invalid_request

T = TypeVar("T")

# msgspec ends a message with where the value was: " - at `$.a[0].b`", or for a
# dict key " - at `key` in `$.a`".
_WHERE = re.compile(r" - at `(?:key` in `)?\$\.?(?P<path>[^`]*)`$")
_MISSING_FIELD = re.compile(r"^Object missing required field `(?P<field>[^`]+)`")

# Decoders are built once per type: building one compiles the type's description.
_DECODERS: dict[Any, msgspec.json.Decoder[Any]] = {}
_ANY = msgspec.json.Decoder()


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


def decode(body: bytes | str | Any, type: type[T], prefix: str | None = None) -> T:
    """`body` as a `type`: raw JSON (bytes or str) is decoded, anything else is taken
    as decoded JSON. Raises a 400 `APIError` for invalid JSON (a lone UTF-16
    surrogate escape included) or a value `type` does not accept; `prefix` is the
    path of `body` within the request, for the error's `param`."""
    try:
        if isinstance(body, bytes | str):
            decoder = _DECODERS.get(type)
            if decoder is None:
                decoder = _DECODERS[type] = msgspec.json.Decoder(type)
            return decoder.decode(body)
        return msgspec.convert(body, type, str_keys=True)
    except msgspec.ValidationError as exc:
        raise _validation_error(exc, prefix) from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise invalid_request(f"The request body is not valid JSON: {exc}") from None


def parse_json(data: bytes | str) -> Any:
    """Decode a request body as plain JSON; invalid JSON, non-UTF-8 or a lone
    surrogate is a 400."""
    try:
        return _ANY.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise invalid_request(f"The request body is not valid JSON: {exc}") from None
