"""A streamed response: an async context manager that hands out parsed chunks."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import httpx
import trio
from httpx_sse import EventSource

from sluiceway.client._transport import Transport
from sluiceway.client.errors import (
    APIStreamError,
    ResponseFormatError,
    StreamInterruptedError,
)
from sluiceway.protocol import ErrorObject

T = TypeVar("T")


class Stream(Generic[T]):
    """One streamed request (``stream=True``). Use it as an async context manager::

        async with await client.chat.completions.create(..., stream=True) as stream:
            async for chunk in stream:
                ...

    Entering the block sends the request (retrying 429/503 like any call) and
    raises the typed error if the server refuses it. Inside, ``async for`` yields
    one parsed chunk per SSE ``data:`` event and stops at ``data: [DONE]``.

    Promises:

    * A stream that ends without ``[DONE]`` (connection cut, server died) raises
      :class:`StreamInterruptedError`; an error event from the server raises
      :class:`APIStreamError`. Nothing is retried once the response has started.
    * Each wait for the next event is bounded by the call's ``timeout`` (an idle
      limit, so a long answer is never cut while tokens keep coming); it raises
      :class:`APITimeoutError`. Bound the whole stream with your own
      ``trio.fail_after`` / ``move_on_after`` around the block.
    * Leaving the block for any reason (end, ``break``, exception, cancellation,
      deadline) closes the HTTP connection before the block exits, so the server
      sees the disconnect and aborts the work.
    * Iterating is not a generator: no async generator of ours is suspended
      across your code, and the stream holds no cancel scope between events.
    """

    def __init__(
        self,
        client: Transport,
        path: str,
        body: Mapping[str, Any],
        parse: Callable[[dict[str, Any]], T],
        timeout: float | None,
    ) -> None:
        self._client = client
        self._path = path
        self._body = dict(body)
        self._parse = parse
        self._timeout = timeout
        self._response: httpx.Response | None = None
        self._events: Any = None  # httpx-sse's async generator of ServerSentEvent
        self._entered = False
        self._done = False  # saw [DONE]
        self._closed = False

    @property
    def response(self) -> httpx.Response | None:
        """The HTTP response (headers only are meaningful) once the block is entered."""
        return self._response

    @property
    def completed(self) -> bool:
        """True once ``data: [DONE]`` was received."""
        return self._done

    async def __aenter__(self) -> Stream[T]:
        if self._entered:
            raise RuntimeError("a Stream can be entered only once")
        self._entered = True
        with self._client._deadline(self._timeout, "opening the stream"):
            response = await self._client._send(
                "POST",
                self._path,
                json=self._body,
                stream=True,
                headers={"Accept": "text/event-stream", "Cache-Control": "no-store"},
            )
        self._response = response
        content_type = response.headers.get("content-type", "").partition(";")[0].strip()
        if content_type != "text/event-stream":
            await self.aclose()
            raise ResponseFormatError(
                f"expected a text/event-stream response, got {content_type or 'no content type'!r}"
            )
        self._events = EventSource(response).aiter_sse()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __aiter__(self) -> Stream[T]:
        if not self._entered:
            raise RuntimeError(
                "enter the stream first: `async with await client...create(..., stream=True) "
                "as stream: async for chunk in stream: ...`"
            )
        return self

    async def __anext__(self) -> T:
        if self._done or self._closed:
            raise StopAsyncIteration
        while True:
            try:
                with self._client._deadline(self._timeout, "waiting for the next stream event"):
                    event = await self._events.__anext__()
            except StopAsyncIteration:
                self._closed = True
                raise StreamInterruptedError(
                    "the stream ended without `data: [DONE]`: the answer is incomplete"
                ) from None
            except httpx.TransportError as exc:
                raise StreamInterruptedError(
                    f"the connection broke mid-stream ({type(exc).__name__}: {exc}); "
                    "the answer is incomplete"
                ) from exc
            data = event.data
            if event.event == "error":
                raise APIStreamError(data, error=_error_from_text(data))
            if not data.strip():
                continue  # an event with only id/retry/event fields
            if data.strip() == "[DONE]":
                self._done = True
                raise StopAsyncIteration
            try:
                obj = json.loads(data)
            except ValueError as exc:
                raise ResponseFormatError(f"a stream event is not JSON: {data[:200]!r}") from exc
            if not isinstance(obj, dict):
                raise ResponseFormatError(f"a stream event is not a JSON object: {data[:200]!r}")
            if "error" in obj and "choices" not in obj:
                error = ErrorObject.from_dict(obj)
                raise APIStreamError(error.message, error=error)
            try:
                return self._parse(obj)
            except (KeyError, TypeError, ValueError) as exc:
                raise ResponseFormatError(f"malformed chunk: {data[:200]!r}") from exc

    async def aclose(self) -> None:
        """Close the HTTP response now (idempotent; safe under cancellation)."""
        if self._closed and self._response is None:
            return
        self._closed = True
        events, self._events = self._events, None
        if events is not None:
            await _unwind(events)
        response, self._response = self._response, None
        if response is not None:
            await _close_response(response)
            self._response = response  # keep headers readable


def _error_from_text(data: str) -> ErrorObject:
    try:
        obj = json.loads(data)
    except ValueError:
        return ErrorObject(data, "api_error")
    if isinstance(obj, dict):
        return ErrorObject.from_dict(obj)
    return ErrorObject(str(obj), "api_error")


async def _unwind(agen: Any) -> None:
    """Finish httpx's chain of async generators without leaving any suspended.

    ``aclose()`` on the outermost one would leave the inner ones (httpx, httpcore)
    suspended at a ``yield`` for the garbage collector, which trio reports as a
    ResourceWarning. Resuming the chain inside an already-cancelled scope makes
    the innermost socket read raise Cancelled, which unwinds every generator
    normally (httpcore closes the connection on the way out). Data already
    buffered may be read first; that is bounded by the buffer.
    """
    with trio.CancelScope() as scope:
        scope.cancel()
        try:
            while True:
                await agen.__anext__()
        except (StopAsyncIteration, Exception):
            pass
    await agen.aclose()  # a no-op when finished; closes a never-started generator


async def _close_response(response: httpx.Response) -> None:
    with trio.CancelScope(shield=True):
        try:
            await response.aclose()
        except Exception:
            pass
