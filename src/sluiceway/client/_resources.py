"""The OpenAI-shaped namespaces: client.chat.completions, client.completions,
client.embeddings, client.models."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, overload

from sluiceway.client._defaults import DEFAULT
from sluiceway.client._streaming import Stream
from sluiceway.client._transport import Transport
from sluiceway.protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionChunk,
    EmbeddingList,
    Model,
    ModelList,
)

# `timeout=` parameters (ASYNC109) keep the OpenAI call shape; each becomes a
# trio cancel scope inside, so callers may equally use their own scopes.



class ChatCompletions:
    """``client.chat.completions``."""

    def __init__(self, client: Transport) -> None:
        self._client = client

    @overload
    async def create(
        self,
        *,
        messages: Sequence[Any],
        model: str | None = ...,
        stream: Literal[False] = ...,
        timeout: Any = ...,  # noqa: ASYNC109
        **params: Any,
    ) -> ChatCompletion: ...

    @overload
    async def create(
        self,
        *,
        messages: Sequence[Any],
        model: str | None = ...,
        stream: Literal[True],
        timeout: Any = ...,  # noqa: ASYNC109
        **params: Any,
    ) -> Stream[ChatCompletionChunk]: ...

    async def create(
        self,
        *,
        messages: Sequence[Any],
        model: str | None = None,
        stream: bool = False,
        timeout: Any = DEFAULT,  # noqa: ASYNC109
        **params: Any,
    ) -> ChatCompletion | Stream[ChatCompletionChunk]:
        """``POST /v1/chat/completions``.

        ``messages`` is one conversation (a list of ``{"role", "content"}``) or,
        on sluiceway, a list of conversations (batch chat; choice index is
        ``conversation_index * n + j``). Other OpenAI parameters (``max_tokens``,
        ``temperature``, ``n``, ``stop``, ``seed``, ``logprobs``, ...) pass
        through; ``None`` values are left out.

        Without ``stream``: returns the :class:`ChatCompletion` or raises a typed
        :class:`APIError`. With ``stream=True``: returns an unopened
        :class:`Stream`; the request is sent when you enter it::

            async with await client.chat.completions.create(..., stream=True) as s:
                async for chunk in s: ...
        """
        body = self._client._body({"messages": list(messages), **params}, model)
        if stream:
            body["stream"] = True
            return Stream(
                self._client,
                "/v1/chat/completions",
                body,
                ChatCompletionChunk.from_dict,
                self._client._resolve(timeout),
            )
        data = await self._client._request_json(
            "POST", "/v1/chat/completions", json=body, timeout=timeout
        )
        return ChatCompletion.from_dict(data)

    def stream(
        self,
        *,
        messages: Sequence[Any],
        model: str | None = None,
        timeout: Any = DEFAULT,
        **params: Any,
    ) -> Stream[ChatCompletionChunk]:
        """Same as ``create(..., stream=True)`` without the ``await``:
        ``async with client.chat.completions.stream(...) as s:``."""
        body = self._client._body({"messages": list(messages), **params}, model)
        body["stream"] = True
        return Stream(
            self._client,
            "/v1/chat/completions",
            body,
            ChatCompletionChunk.from_dict,
            self._client._resolve(timeout),
        )


class Chat:
    """``client.chat``."""

    def __init__(self, client: Transport) -> None:
        self.completions = ChatCompletions(client)


class Completions:
    """``client.completions`` (the legacy text completions API)."""

    def __init__(self, client: Transport) -> None:
        self._client = client

    @overload
    async def create(
        self,
        *,
        prompt: Any,
        model: str | None = ...,
        stream: Literal[False] = ...,
        timeout: Any = ...,  # noqa: ASYNC109
        **params: Any,
    ) -> Completion: ...

    @overload
    async def create(
        self,
        *,
        prompt: Any,
        model: str | None = ...,
        stream: Literal[True],
        timeout: Any = ...,  # noqa: ASYNC109
        **params: Any,
    ) -> Stream[CompletionChunk]: ...

    async def create(
        self,
        *,
        prompt: Any,
        model: str | None = None,
        stream: bool = False,
        timeout: Any = DEFAULT,  # noqa: ASYNC109
        **params: Any,
    ) -> Completion | Stream[CompletionChunk]:
        """``POST /v1/completions``. ``prompt`` is a string, a list of strings
        (choice index ``prompt_index * n + j``), token ids, or a list of them.
        Streaming works as for chat: ``async with await create(..., stream=True)``.
        """
        body = self._client._body({"prompt": prompt, **params}, model)
        if stream:
            body["stream"] = True
            return Stream(
                self._client,
                "/v1/completions",
                body,
                CompletionChunk.from_dict,
                self._client._resolve(timeout),
            )
        data = await self._client._request_json(
            "POST", "/v1/completions", json=body, timeout=timeout
        )
        return Completion.from_dict(data)

    def stream(
        self, *, prompt: Any, model: str | None = None, timeout: Any = DEFAULT, **params: Any
    ) -> Stream[CompletionChunk]:
        """``async with client.completions.stream(...) as s:``."""
        body = self._client._body({"prompt": prompt, **params}, model)
        body["stream"] = True
        return Stream(
            self._client,
            "/v1/completions",
            body,
            CompletionChunk.from_dict,
            self._client._resolve(timeout),
        )


class Embeddings:
    """``client.embeddings``."""

    def __init__(self, client: Transport) -> None:
        self._client = client

    async def create(
        self,
        *,
        input: Any,
        model: str | None = None,
        timeout: Any = DEFAULT,  # noqa: ASYNC109
        **params: Any,
    ) -> EmbeddingList:
        """``POST /v1/embeddings``. ``input`` is a string, a list of strings, token
        ids, or a list of them; ``encoding_format`` (default "float") and
        ``dimensions`` go in ``params``. With "base64" each ``embedding`` is the
        base64 text of its float32 bytes, as the server sends it."""
        body = self._client._body({"input": input, **params}, model)
        data = await self._client._request_json(
            "POST", "/v1/embeddings", json=body, timeout=timeout
        )
        return EmbeddingList.from_dict(data)


class Models:
    """``client.models``."""

    def __init__(self, client: Transport) -> None:
        self._client = client

    async def list(self, *, timeout: Any = DEFAULT) -> ModelList:  # noqa: ASYNC109
        """``GET /v1/models``."""
        return ModelList.from_dict(
            await self._client._request_json("GET", "/v1/models", timeout=timeout)
        )

    async def retrieve(self, model: str, *, timeout: Any = DEFAULT) -> Model:  # noqa: ASYNC109
        """``GET /v1/models/{model}``."""
        return Model.from_dict(
            await self._client._request_json("GET", f"/v1/models/{model}", timeout=timeout)
        )
