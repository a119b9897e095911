"""Request preparation off the event loop, and prompts -> token ids: plain text,
token ids, or chat conversations via the model's template.

Parsing, validating, rendering a chat template and tokenizing all grow with the
request body: a body of megabytes holds the event loop's thread for seconds, and
every stream on the server pauses meanwhile. `prepare` runs that work where it
fits: on the loop for a small body, else on a worker thread (the sizes behind the
thresholds: `docs/benchmarks.md`, "Measurements behind choices in the code").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from typing import Any, TypeVar

import attrs
import trio

from sluiceway.api.http.errors import APIError, invalid_request
from sluiceway.api.http.wire import decode
from sluiceway.api.pipeline.tool_prompt import fallback_messages, template_knows_tools
from sluiceway.api.state import ServerState
from sluiceway.engine.arrivals import Arrival, Arrivals

T = TypeVar("T")

# Bodies up to this size are prepared on the event loop: for a typical chat
# request a hop to a worker thread costs about as much as the preparation itself,
# and the costliest body of this size still takes the loop only a few
# milliseconds.
INLINE_BYTES = 2048
# Bodies above this size (tens of milliseconds of work and up) are prepared on
# their own worker thread, one at a time: together they take at most one core from the model,
# and they never queue ahead of ordinary requests, which keep the other limiter.
HEAVY_BYTES = 64 << 10

_arrival: ContextVar[Arrival | None] = ContextVar("sluiceway_arrival", default=None)


@contextmanager
def arriving(arrivals: Arrivals) -> Iterator[None]:
    """Count the current HTTP request as being prepared (see `Arrivals`), so that
    an idle engine holds its first step for it, until `prepared()` or the end of
    the block, whichever is first. Tasks started inside the block see it."""
    with arrivals.preparing() as arrival:
        token = _arrival.set(arrival)
        try:
            yield
        finally:
            _arrival.reset(token)


def prepared() -> None:
    """The current request is ready to submit to the engine; nothing outside
    `arriving`."""
    arrival = _arrival.get()
    if arrival is not None:
        arrival.end()


async def prepare(state: ServerState, size: int, fn: Callable[[], T]) -> T:
    """Run `fn`, the preparation of a request whose body has `size` bytes (parsing,
    validation, chat template, tokenizer), so that it cannot delay other streams.

    Up to `INLINE_BYTES` it runs here, on the event loop. Larger work runs on a
    worker thread under `state.tokenize_limiter`, or beyond `HEAVY_BYTES` under
    `state.heavy_input_limiter`; either runs one thread at a time.

    Cancellation (the client has gone) ends a wait for the limiter at once. It
    does not interrupt a running thread, and the event loop is free meanwhile:
    `fn` stops at its next `check_cancelled()` (after parsing, and before each
    template render and each tokenization), then this raises `trio.Cancelled`.
    The limiter stays held until the thread returns, so what a cancelled request
    still costs is the stage of its work in progress.
    """
    if size <= INLINE_BYTES:
        return fn()
    limiter = state.heavy_input_limiter if size > HEAVY_BYTES else state.tokenize_limiter
    return await trio.to_thread.run_sync(fn, limiter=limiter)


def check_cancelled() -> None:
    """A stopping point for work run by `prepare`: on its worker thread, raises
    `trio.Cancelled` once the request has been cancelled; on the event loop's thread
    (small work, not worth interrupting), does nothing."""
    with suppress(RuntimeError):  # not a trio worker thread
        trio.from_thread.check_cancelled()


def parse_body(data: bytes | str, type: type[T]) -> T:
    """A request body decoded into its `type` (a 400 `APIError` when it is not one),
    for work run by `prepare`; a stopping point after it.

    Decoding holds the GIL throughout, on any thread; msgspec, which decodes and
    validates in one pass, holds it for a fraction of what `json.loads` did.
    Decoders that let other threads in (json's C scanner with Python hooks, its
    pure-Python scanner) take several times as long, and other streams then
    paused longer, not shorter: a model step retakes the GIL after every torch op,
    waiting up to the switch interval each time while a Python thread computes.
    """
    body = decode(data, type)
    check_cancelled()
    return body


@attrs.frozen
class Prompt:
    """One prompt ready for the engine. `text` is the prompt's text (for `echo`)."""

    token_ids: tuple[int, ...]
    text: str


def _encode(tokenizer: Any, text: str, add_special_tokens: bool) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text, add_special_tokens=add_special_tokens))


def completion_prompts(
    tokenizer: Any, prompts: Sequence[str | tuple[int, ...]], echo: bool
) -> list[Prompt]:
    """Tokenize text prompts (token-id prompts are decoded only for `echo`). Stops
    at a cancellation between prompts (see `prepare`)."""
    out = []
    for p in prompts:
        check_cancelled()
        if isinstance(p, str):
            out.append(Prompt(_encode(tokenizer, p, True), p))
        else:
            out.append(Prompt(p, tokenizer.decode(list(p)) if echo else ""))
    return out


def text_prompt(tokenizer: Any, text: str, add_special_tokens: bool) -> list[Prompt]:
    check_cancelled()
    return [Prompt(_encode(tokenizer, text, add_special_tokens), text)]


def _render_chat(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    add_generation_prompt: bool,
    tools: Sequence[dict[str, Any]] = (),
    template: ChatTemplate | None = None,
) -> str:
    options: dict[str, Any] = dict(template.kwargs) if template is not None else {}
    if template is not None and template.text is not None:
        options["chat_template"] = template.text
    if template_knows_tools(tokenizer, options.get("chat_template")):
        if tools:
            options["tools"] = list(tools)
    else:
        messages = fallback_messages(messages, tools)
    try:
        text = tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt, **options
        )
    except Exception as exc:  # jinja's TemplateError, or no template at all (ValueError)
        raise invalid_request(
            f"The chat template rejected the messages: {exc}", "messages"
        ) from None
    if not isinstance(text, str):
        raise invalid_request("The model's chat template did not produce text.", "messages")
    return text


@attrs.frozen
class ChatTemplate:
    """How conversations are rendered: `text`, a template used instead of the
    model's (`--chat-template`; None: the model's), given `kwargs` beside the
    messages (`chat_template_kwargs` over `--default-chat-template-kwargs`)."""

    text: str | None = None
    kwargs: Mapping[str, Any] = attrs.field(factory=dict)



def chat_prompts(
    tokenizer: Any,
    conversations: Sequence[Sequence[dict[str, Any]]],
    add_generation_prompt: bool,
    tools: Sequence[dict[str, Any]] = (),
    template: ChatTemplate | None = None,
) -> list[Prompt]:
    """Render each conversation with the model's chat template, or `template`'s
    (with `tools`, see `tool_prompt`), and tokenize it. Stops at a cancellation
    before each render and each tokenization (see `prepare`); a template that
    rejects the messages is a 400."""
    out = []
    for conv in conversations:
        check_cancelled()
        text = _render_chat(tokenizer, conv, add_generation_prompt, tools, template)
        check_cancelled()
        # The template already wrote any BOS/special tokens it wants.
        out.append(Prompt(_encode(tokenizer, text, False), text))
    return out


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
