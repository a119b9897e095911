"""POST /v1/chat/completions and POST /v1/completions, streaming and not: the
OpenAI bodies parsed, then answered by the shared pipeline."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response

from sluiceway.api.pipeline.generation import (
    answer_in_background,
    chat_prompts,
    completion_prompts,
    generate,
)
from sluiceway.api.pipeline.shapes import ChatShape, CompletionShape
from sluiceway.api.state import ServerState

blueprint = Blueprint("openai_chat", __name__)


@blueprint.post("/v1/chat/completions")
async def chat_completions() -> Response:
    return await generate(chat_prompts, ChatShape, "messages")


@blueprint.post("/v1/completions")
async def completions() -> Response:
    return await generate(completion_prompts, CompletionShape, "prompt")


async def answer_chat_line(state: ServerState, data: bytes, key: str | None) -> dict[str, Any]:
    """A Batch API line for /v1/chat/completions (see `answer_in_background`)."""
    return await answer_in_background(state, data, chat_prompts, ChatShape, "messages", key)


async def answer_completion_line(
    state: ServerState, data: bytes, key: str | None
) -> dict[str, Any]:
    """A Batch API line for /v1/completions (see `answer_in_background`)."""
    return await answer_in_background(state, data, completion_prompts, CompletionShape, "prompt", key)
