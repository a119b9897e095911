"""Fan-out helpers: one stream split per choice, and many requests at once."""

from __future__ import annotations

import copy
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

import attrs
import trio

from sluiceway.client._defaults import DEFAULT
from sluiceway.client._resources import Chat, Completions
from sluiceway.client.errors import APIError, ResponseFormatError, StreamInterruptedError
from sluiceway.protocol import (
    ChatCompletion,
    ChatCompletionChunkChoice,
    Completion,
    CompletionChoice,
    Usage,
)


class Generating(Protocol):
    """What fanning out needs of a client: its chat and completions resources."""

    chat: Chat
    completions: Completions

ChunkChoice = ChatCompletionChunkChoice | CompletionChoice
Result = ChatCompletion | Completion | APIError


# ----------------------------------------------------------------- stream_choices


class ChoiceStream:
    """The events of one choice of a streamed request; an async iterator.

    Yields :class:`ChatCompletionChunkChoice` (chat) or :class:`CompletionChoice`
    (completions); both have ``.text`` (the new text) and ``.finish_reason`` (set
    on the last one). Iteration ends after the choice's last event; if the
    stream failed first, it raises that error instead.

    ``text``, ``finish_reason`` and ``error`` summarize what has been *received*
    for this choice so far, whether or not it has been read yet.
    ``await choice.aclose()`` (or leaving the ``stream_choices`` block) stops
    delivery to this choice.
    """

    def __init__(
        self, index: int, prompt_index: int, receive: trio.MemoryReceiveChannel[ChunkChoice]
    ) -> None:
        self.index = index
        self.prompt_index = prompt_index
        self.text = ""
        self.finish_reason: str | None = None
        self.error: APIError | None = None
        self._receive = receive

    def __repr__(self) -> str:
        return (
            f"<ChoiceStream index={self.index} prompt_index={self.prompt_index} "
            f"finish_reason={self.finish_reason!r} chars={len(self.text)}>"
        )

    def __aiter__(self) -> ChoiceStream:
        return self

    async def __anext__(self) -> ChunkChoice:
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            if self.error is not None:
                raise _copy_error(self.error) from self.error
            raise StopAsyncIteration from None

    async def collect(self) -> str:
        """Read this choice to its end and return its whole text."""
        async for _ in self:
            pass
        return self.text

    async def aclose(self) -> None:
        await self._receive.aclose()


@attrs.define
class ChoiceStreams(Sequence[ChoiceStream]):
    """The per-choice streams of one request, indexed by choice index.

    ``usage`` is set when the server sends a usage chunk; ``error`` when the
    stream failed.
    """

    choices: list[ChoiceStream]
    n: int
    usage: Usage | None = None
    error: APIError | None = None

    def __getitem__(self, i: Any) -> Any:
        return self.choices[i]

    def __len__(self) -> int:
        return len(self.choices)

    def for_prompt(self, prompt_index: int) -> list[ChoiceStream]:
        """The ``n`` choices of one prompt / conversation."""
        return self.choices[prompt_index * self.n : (prompt_index + 1) * self.n]

    def texts(self) -> list[str]:
        """Every choice's text received so far, by choice index."""
        return [c.text for c in self.choices]


def _copy_error(exc: APIError) -> APIError:
    # Each consumer task raises its own instance: one exception object raised in
    # several tasks would collect their tracebacks into one.
    clone = copy.copy(exc)
    clone.__traceback__ = None
    return clone


def count_prompts(messages: Sequence[Any] | None, prompt: Any) -> int:
    """How many prompts a request carries (batch chat, batch completions)."""
    if messages is not None:
        if messages and all(isinstance(m, (list, tuple)) for m in messages):
            return len(messages)
        return 1
    if isinstance(prompt, (list, tuple)) and prompt:
        if all(isinstance(p, int) for p in prompt):
            return 1  # one prompt as token ids
        return len(prompt)
    return 1


@asynccontextmanager
async def stream_choices(
    client: Generating,
    *,
    messages: Sequence[Any] | None,
    prompt: Any,
    model: str | None,
    n: int,
    timeout: Any,  # noqa: ASYNC109
    **params: Any,
) -> AsyncIterator[ChoiceStreams]:
    """See :meth:`AsyncClient.stream_choices`."""
    if (messages is None) == (prompt is None):
        raise ValueError("give exactly one of messages= (chat) or prompt= (completions)")
    if n > 1 or "n" in params:
        params["n"] = n
    if messages is not None:
        stream: Any = client.chat.completions.stream(
            messages=messages, model=model, timeout=timeout, **params
        )
    else:
        stream = client.completions.stream(prompt=prompt, model=model, timeout=timeout, **params)
    total = count_prompts(messages, prompt) * max(n, 1)
    sends: list[trio.MemorySendChannel[ChunkChoice]] = []
    streams = []
    for i in range(total):
        # Unbounded: the router never waits on one reader, so a slow or absent
        # consumer cannot hold up the others. Bounded by the answer's length.
        send, receive = trio.open_memory_channel[ChunkChoice](math.inf)
        sends.append(send)
        streams.append(ChoiceStream(i, i // max(n, 1), receive))
    choices = ChoiceStreams(streams, max(n, 1))
    async with stream:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_route, stream, sends, choices)
                try:
                    yield choices
                except BaseException:
                    nursery.cancel_scope.cancel()
                    raise
                if any(c.finish_reason is None and c.error is None for c in choices):
                    nursery.cancel_scope.cancel()  # left early: close the stream now
                # Otherwise every choice has finished and only the usage chunk and
                # [DONE] are left: let the router read them, so `choices.usage` is set.
        except BaseExceptionGroup as group:
            # The router only fails on a bug, so a lone exception is the caller's
            # own (or a cancellation): give it back unwrapped.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from group.exceptions[0].__cause__
            raise


async def _route(
    stream: Any, sends: list[trio.MemorySendChannel[ChunkChoice]], choices: ChoiceStreams
) -> None:
    """Move each chunk's choices to their channels; never blocks on a reader."""
    unfinished = set(range(len(sends)))
    try:
        async for chunk in stream:
            if chunk.usage is not None:
                choices.usage = chunk.usage
            for event in chunk.choices:
                _deliver(event, sends, choices, unfinished)
        if unfinished:
            raise StreamInterruptedError(
                f"the stream finished without a finish_reason for choices {sorted(unfinished)}"
            )
    except APIError as exc:
        choices.error = exc
        for i in unfinished:
            choices[i].error = exc
    finally:
        for send in sends:
            send.close()


def _deliver(
    event: ChunkChoice,
    sends: list[trio.MemorySendChannel[ChunkChoice]],
    choices: ChoiceStreams,
    unfinished: set[int],
) -> None:
    i = event.index
    if not 0 <= i < len(sends):
        raise ResponseFormatError(
            f"the server sent choice index {i}, but this request has {len(sends)} choices"
        )
    choice = choices[i]
    choice.text += event.text
    if event.finish_reason is not None:
        choice.finish_reason = event.finish_reason
    try:
        sends[i].send_nowait(event)
    except trio.BrokenResourceError:
        pass  # that consumer closed its stream: it no longer wants the events
    if event.finish_reason is not None:
        sends[i].close()
        unfinished.discard(i)


# ------------------------------------------------------------------------ run_many


@attrs.frozen
class ChatCall:
    """One chat call of :meth:`AsyncClient.run_many` (the wire body is
    ``protocol.ChatCompletionRequest``). ``params`` are the other
    ``create`` arguments; ``timeout`` its own deadline (None: the client's)."""

    messages: Sequence[Any]
    model: str | None = None
    params: Mapping[str, Any] = attrs.field(factory=dict)
    timeout: float | None = None


@attrs.frozen
class CompletionCall:
    """One completions call of :meth:`AsyncClient.run_many` (the wire body is
    ``protocol.CompletionRequest``)."""

    prompt: Any
    model: str | None = None
    params: Mapping[str, Any] = attrs.field(factory=dict)
    timeout: float | None = None


def _as_request(spec: ChatCall | CompletionCall | Mapping[str, Any]) -> Any:
    if isinstance(spec, (ChatCall, CompletionCall)):
        return spec
    params = dict(spec)
    if params.pop("stream", False):
        raise ValueError("run_many runs non-streamed requests; use stream_choices to stream")
    timeout = params.pop("timeout", None)
    model = params.pop("model", None)
    if "messages" in params:
        return ChatCall(params.pop("messages"), model, params, timeout)
    if "prompt" in params:
        return CompletionCall(params.pop("prompt"), model, params, timeout)
    raise ValueError(f"a request needs messages= or prompt=: {spec!r}")


async def _run_one(client: Generating, request: Any) -> ChatCompletion | Completion:
    timeout = DEFAULT if request.timeout is None else request.timeout
    if isinstance(request, ChatCall):
        return await client.chat.completions.create(
            messages=request.messages, model=request.model, timeout=timeout, **request.params
        )
    return await client.completions.create(
        prompt=request.prompt, model=request.model, timeout=timeout, **request.params
    )


async def run_many(
    client: Generating,
    requests: Sequence[ChatCall | CompletionCall | Mapping[str, Any]],
    *,
    max_concurrency: int,
    fail_fast: bool,
) -> list[Result]:
    """See :meth:`AsyncClient.run_many`."""
    specs = [_as_request(r) for r in requests]  # bad specs fail before anything is sent
    limiter = trio.CapacityLimiter(max_concurrency)
    results: list[Any] = [None] * len(specs)
    failures: list[APIError] = []

    async def one(i: int, nursery: trio.Nursery) -> None:
        async with limiter:
            try:
                results[i] = await _run_one(client, specs[i])
            except APIError as exc:
                results[i] = exc
                if fail_fast and not failures:
                    failures.append(exc)
                    nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        for i in range(len(specs)):
            nursery.start_soon(one, i, nursery)
    if failures:
        raise failures[0]
    return results
