"""Legacy completions: full responses and streamed chunks (same choice shape)."""

from __future__ import annotations

import attrs

from sluiceway.protocol._codec import Wire
from sluiceway.protocol.envelope import CHUNK_NULL_FLAGS, CHUNK_OMIT_NONE, ENVELOPE_ORDER
from sluiceway.protocol.logprobs import CompletionLogprobs
from sluiceway.protocol.usage import Usage


@attrs.frozen
class CompletionChoice(Wire):
    """A choice of the completions API, streamed or not (same shape in both).

    ``index`` is ``prompt_index * n + j`` for a list of prompts.
    """

    index: int
    text: str = ""
    finish_reason: str | None = None
    logprobs: CompletionLogprobs | None = None
    stop_reason: str | int | None = None

    wire_order = ("index", "text", "logprobs", "finish_reason", "stop_reason")
    wire_omit_none = frozenset({"stop_reason"})


@attrs.frozen
class Completion(Wire):
    id: str
    model: str
    choices: list[CompletionChoice]
    created: int = 0
    usage: Usage | None = None
    object: str = "text_completion"
    system_fingerprint: str | None = None

    wire_order = ENVELOPE_ORDER


@attrs.frozen
class CompletionChunk(Wire):
    """One ``data:`` event of a streamed completion (OpenAI calls it text_completion too)."""

    id: str
    model: str
    choices: list[CompletionChoice]
    created: int = 0
    usage: Usage | None = None
    object: str = "text_completion"
    system_fingerprint: str | None = None
    # The chunk carries `"usage": null`: its stream asked for usage
    # (stream_options.include_usage), which comes in the last chunk.
    usage_null: bool = attrs.field(default=False, kw_only=True)

    wire_order = ENVELOPE_ORDER
    wire_omit_none = CHUNK_OMIT_NONE
    wire_null_flags = CHUNK_NULL_FLAGS
