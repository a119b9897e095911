"""The object around choices, shared by the four response kinds (full and chunked,
chat and completions): they differ only in their choice type and object name."""

from __future__ import annotations

from types import MappingProxyType

# The order OpenAI writes an envelope's keys in (the classes keep `id, model,
# choices` first, as their positional arguments).
ENVELOPE_ORDER = ("id", "object", "created", "model", "system_fingerprint", "choices", "usage")
# A chunk carries `usage` only when it is the usage chunk, or as null when its
# stream asked for usage (`usage_null`); full responses always carry it.
CHUNK_OMIT_NONE = frozenset({"usage"})
CHUNK_NULL_FLAGS = MappingProxyType({"usage_null": "usage"})
