"""Prompts -> token ids: plain text, token ids, or chat conversations via the model's template."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import attrs
import trio

from sluiceway.api.errors import APIError, invalid_request
from sluiceway.api.state import ServerState

T = TypeVar("T")

# Below this many characters tokenizing on the event loop costs less than a thread hop.
_INLINE_CHARS = 4096


@attrs.frozen
class Prompt:
    """One prompt ready for the engine. `text` is the prompt's text (for `echo`)."""

    token_ids: tuple[int, ...]
    text: str


async def _run(state: ServerState, size: int, fn: Callable[[], T]) -> T:
    if size <= _INLINE_CHARS:
        return fn()
    return await trio.to_thread.run_sync(fn, limiter=state.tokenize_limiter)


def _encode(tokenizer: Any, text: str, add_special_tokens: bool) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text, add_special_tokens=add_special_tokens))


async def completion_prompts(
    state: ServerState, prompts: Sequence[str | tuple[int, ...]], echo: bool
) -> list[Prompt]:
    tok = state.tokenizer
    size = sum(len(p) for p in prompts if isinstance(p, str))

    def work() -> list[Prompt]:
        out = []
        for p in prompts:
            if isinstance(p, str):
                out.append(Prompt(_encode(tok, p, True), p))
            else:
                out.append(Prompt(p, tok.decode(list(p)) if echo else ""))
        return out

    return await _run(state, size, work)


async def text_prompt(state: ServerState, text: str, add_special_tokens: bool) -> list[Prompt]:
    tok = state.tokenizer
    return await _run(
        state, len(text), lambda: [Prompt(_encode(tok, text, add_special_tokens), text)]
    )


def _render_chat(
    tokenizer: Any, messages: Sequence[dict[str, str]], add_generation_prompt: bool
) -> str:
    try:
        text = tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
        )
    except Exception as exc:  # jinja's TemplateError, or no template at all (ValueError)
        raise invalid_request(
            f"The chat template rejected the messages: {exc}", "messages"
        ) from None
    if not isinstance(text, str):
        raise invalid_request("The model's chat template did not produce text.", "messages")
    return text


async def chat_prompts(
    state: ServerState,
    conversations: Sequence[Sequence[dict[str, str]]],
    add_generation_prompt: bool,
) -> list[Prompt]:
    tok = state.tokenizer
    size = sum(len(m["content"]) for conv in conversations for m in conv)

    def work() -> list[Prompt]:
        out = []
        for conv in conversations:
            text = _render_chat(tok, conv, add_generation_prompt)
            # The template already wrote any BOS/special tokens it wants.
            out.append(Prompt(_encode(tok, text, False), text))
        return out

    return await _run(state, size, work)


def check_lengths(
    state: ServerState, prompts: Sequence[Prompt], max_tokens: int | None, param: str
) -> None:
    """400 for an empty prompt or one that, with `max_tokens`, overflows the context."""
    limit = state.engine.max_model_len
    for prompt in prompts:
        n = len(prompt.token_ids)
        if n == 0:
            raise invalid_request("The prompt is empty (no tokens).", param)
        if n + (max_tokens or 1) > limit:
            raise APIError(
                400,
                f"This model's maximum context length is {limit} tokens; the prompt has "
                f"{n} tokens and asks for {max_tokens or 1} more.",
                "invalid_request_error",
                param if max_tokens is None or n + 1 > limit else "max_tokens",
                "context_length_exceeded",
            )
