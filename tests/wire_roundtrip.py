"""The round trip every server response must survive: decoded into the shared
`sluiceway.protocol` type, then re-encoded, it is the same JSON (same keys, same
values, same JSON types), so the types lose nothing the server sends."""

from __future__ import annotations

import json
from typing import Any

import attrs

from sluiceway import protocol

# (method, path) -> the type of its 200 JSON body; other paths are not wire types.
_BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/v1/chat/completions"): protocol.ChatCompletion,
    ("POST", "/v1/completions"): protocol.Completion,
    ("POST", "/v1/embeddings"): protocol.EmbeddingList,
    ("POST", "/tokenize"): protocol.TokenizeResponse,
    ("POST", "/detokenize"): protocol.DetokenizeResponse,
    ("GET", "/v1/models"): protocol.ModelList,
}
# Their own formats: /health's body is `{"status": ...}`, with an error beside it
# when it answers 503.
_NOT_WIRE = frozenset({"/health", "/metrics", "/openapi.json"})
_CHUNKS = {
    "chat.completion.chunk": protocol.ChatCompletionChunk,
    "text_completion": protocol.CompletionChunk,
}


def _canonical(value: Any) -> str:
    # Sorted keys: the server writes some bodies by hand (/tokenize) in its own
    # order. Through json, 1 and 1.0 and true stay different.
    return json.dumps(value, sort_keys=True)


def check(type_: Any, obj: Any) -> None:
    """`obj` (decoded JSON) decodes into `type_` and re-encodes to the same JSON."""
    again = type_.from_dict(obj).to_dict()
    assert _canonical(again) == _canonical(obj), (type_.__name__, obj, again)


def body_type(method: str, path: str, status: int) -> Any:
    """The protocol type of a JSON response body, or None for an endpoint outside
    the wire types (health, metrics, the OpenAPI document)."""
    if path in _NOT_WIRE:
        return None
    if status >= 400:
        return protocol.ErrorObject
    if method == "GET" and path.startswith("/v1/models/"):
        return protocol.Model
    return _BODIES.get((method, path))


def check_event(data: str) -> None:
    """One SSE event's data: a chunk or an error object (`[DONE]` is not JSON)."""
    if data == "[DONE]":
        return
    obj = json.loads(data)
    check(protocol.ErrorObject if "error" in obj else _CHUNKS[obj["object"]], obj)


@attrs.define
class Recorder:
    """Responses seen during one test, checked at its end."""

    bodies: list[tuple[str, str, int, bytes]] = attrs.field(factory=list)
    events: list[str] = attrs.field(factory=list)

    def check(self) -> int:
        """Check every recorded body and event; returns how many were checked."""
        checked = 0
        for method, path, status, content in self.bodies:
            type_ = body_type(method, path, status)
            if type_ is not None:
                check(type_, json.loads(content))
                checked += 1
        for data in self.events:
            check_event(data)
            checked += 1
        return checked
