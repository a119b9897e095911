"""The embeddings API (`POST /v1/embeddings`): the request body and the list of
vectors it answers."""

from __future__ import annotations

from typing import Annotated, Literal

import attrs
from msgspec import Meta

from sluiceway.protocol._codec import Wire
from sluiceway.protocol.constraints import TokenId
from sluiceway.protocol.requests import TokenIds

MAX_EMBEDDING_INPUTS = 2048
"""Inputs one request may hold, as OpenAI allows."""


@attrs.frozen(kw_only=True)
class EmbeddingRequest:
    """`POST /v1/embeddings`. `input` is a string, an array of strings, an array of
    token ids (one input), or an array of token-id arrays; each is embedded on its
    own. `encoding_format` "float" (default) answers lists of numbers, "base64"
    the little-endian float32 bytes of each vector. `dimensions` cuts the vectors
    to that width (then normalizes them again), where the model was trained for
    it."""

    input: str | Annotated[list[str | TokenId | TokenIds], Meta(min_length=1)]
    model: str | None = None
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    user: str | None = None


@attrs.frozen
class Embedding(Wire):
    """One input's vector: numbers, or their base64 float32 bytes."""

    index: int
    embedding: list[float] | str
    object: str = "embedding"

    wire_order = ("object", "index", "embedding")


@attrs.frozen
class EmbeddingUsage(Wire):
    prompt_tokens: int = 0
    total_tokens: int = 0


@attrs.frozen
class EmbeddingList(Wire):
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage = attrs.field(factory=EmbeddingUsage)
    object: str = "list"

    wire_order = ("object", "data", "model", "usage")
