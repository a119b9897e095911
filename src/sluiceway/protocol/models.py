"""The model list and the tokenizer endpoints' answers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from sluiceway.protocol._codec import JSON, drop_none


@attrs.frozen
class Model:
    id: str
    created: int = 0
    owned_by: str = "sluiceway"
    object: str = "model"
    max_model_len: int | None = None  # vLLM-style extension

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Model:
        return cls(
            id=str(d["id"]),
            created=int(d.get("created") or 0),
            owned_by=d.get("owned_by") or "",
            object=d.get("object") or "model",
            max_model_len=d.get("max_model_len"),
        )

    def to_dict(self) -> JSON:
        d: JSON = {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "owned_by": self.owned_by,
            "max_model_len": self.max_model_len,
        }
        return drop_none(d, "max_model_len")


@attrs.frozen
class ModelList:
    data: list[Model] = attrs.field(factory=list)
    object: str = "list"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelList:
        return cls(
            data=[Model.from_dict(m) for m in d.get("data") or []],
            object=d.get("object") or "list",
        )

    def to_dict(self) -> JSON:
        return {"object": self.object, "data": [m.to_dict() for m in self.data]}


@attrs.frozen
class TokenizeResponse:
    """``POST /tokenize`` (sluiceway extension)."""

    tokens: list[int]
    count: int
    max_model_len: int | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TokenizeResponse:
        tokens = list(d.get("tokens") or [])
        return cls(
            tokens=tokens,
            count=int(d.get("count", len(tokens))),
            max_model_len=d.get("max_model_len"),
        )

    def to_dict(self) -> JSON:
        return {"tokens": self.tokens, "count": self.count, "max_model_len": self.max_model_len}


@attrs.frozen
class DetokenizeResponse:
    """``POST /detokenize`` (sluiceway extension)."""

    prompt: str

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DetokenizeResponse:
        return cls(prompt=str(d.get("prompt") or ""))

    def to_dict(self) -> JSON:
        return {"prompt": self.prompt}
