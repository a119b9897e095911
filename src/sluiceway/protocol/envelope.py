"""The object around choices, shared by the four response kinds (full and chunked,
chat and completions)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluiceway.protocol._codec import JSON, opt
from sluiceway.protocol.usage import Usage


def envelope_fields(d: Mapping[str, Any], choice_type: Any, default_object: str) -> JSON:
    """Constructor arguments shared by the four response envelopes (full and chunked,
    chat and completions); they differ only in their choice type and object name."""
    return {
        "id": str(d.get("id", "")),
        "model": str(d.get("model", "")),
        "choices": [choice_type.from_dict(c) for c in d.get("choices") or []],
        "created": int(d.get("created") or 0),
        "usage": opt(Usage, d.get("usage")),
        "object": d.get("object") or default_object,
        "system_fingerprint": d.get("system_fingerprint"),
    }


def envelope_dict(envelope: Any, *, usage_always: bool) -> JSON:
    """The wire form of an envelope. Full responses always carry `usage` (null when
    unknown); a chunk carries it when its stream asked for usage (null but on the
    last chunk), or when it is the usage chunk."""
    d: JSON = {
        "id": envelope.id,
        "object": envelope.object,
        "created": envelope.created,
        "model": envelope.model,
        "system_fingerprint": envelope.system_fingerprint,
        "choices": [c.to_dict() for c in envelope.choices],
    }
    if usage_always or envelope.usage is not None:
        d["usage"] = None if envelope.usage is None else envelope.usage.to_dict()
    return d
