"""The model list and the tokenizer endpoints' answers."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs

from sluiceway.protocol._codec import Wire, decode


@attrs.frozen
class Model(Wire):
    id: str
    created: int = 0
    owned_by: str = "sluiceway"
    object: str = "model"
    max_model_len: int | None = None  # vLLM-style extension
    # vLLM's too: where the model was loaded from, and for a LoRA adapter the
    # base model it runs on.
    root: str | None = None
    parent: str | None = None

    wire_order = ("id", "object", "created", "owned_by", "root", "parent", "max_model_len")
    wire_omit_none = frozenset({"max_model_len", "root", "parent"})
    wire_decode_defaults = MappingProxyType({"owned_by": ""})


@attrs.frozen
class ModelList(Wire):
    data: list[Model] = attrs.field(factory=list)
    object: str = "list"

    wire_order = ("object", "data")


@attrs.frozen
class TokenizeResponse(Wire):
    """``POST /tokenize`` (sluiceway extension)."""

    tokens: list[int]
    count: int
    max_model_len: int | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TokenizeResponse:
        if d.get("count") is None:  # servers that leave it out: the tokens' count
            d = {**d, "count": len(d.get("tokens") or [])}
        return decode(cls, d)


@attrs.frozen
class DetokenizeResponse(Wire):
    """``POST /detokenize`` (sluiceway extension)."""

    prompt: str
