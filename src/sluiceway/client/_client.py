"""AsyncClient: the HTTP core (retries, deadlines, typed errors) and the namespaces."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx
import trio

from sluiceway.client._defaults import DEFAULT
from sluiceway.client._fanout import ChatCall, ChoiceStreams, CompletionCall, Result
from sluiceway.client._fanout import run_many as _run_many
from sluiceway.client._fanout import stream_choices as _stream_choices
from sluiceway.client._resources import Chat, Completions, Embeddings, Models
from sluiceway.client._retry import RETRYABLE_STATUS, RetryPolicy, parse_retry_after
from sluiceway.client._streaming import _close_response
from sluiceway.client.errors import (
    APIConnectionError,
    APITimeoutError,
    ResponseFormatError,
    status_error,
)
from sluiceway.protocol import ErrorObject, TokenizeResponse

# `timeout=` parameters (ASYNC109) keep the OpenAI call shape; each becomes a
# trio cancel scope inside, so callers may equally use their own scopes.

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT = 600.0


def _root_url(base_url: str) -> str:
    """Accept the server root or an OpenAI-style base URL ending in /v1."""
    url = base_url.rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


class AsyncClient:
    """A trio client for sluiceway or any OpenAI-compatible server::

        async with AsyncClient("http://127.0.0.1:8000") as client:
            reply = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "Hi"}])

    ``base_url`` is the server root (a trailing ``/v1`` is accepted). ``api_key``
    is sent as a bearer token. ``timeout`` (seconds, ``None`` for none) is the
    deadline of one call, retries and backoff included, enforced with a trio
    cancel scope (so ``MockClock`` drives it); for a stream it bounds opening the
    stream and then each wait for the next event. Every call takes ``timeout=``
    to override it. ``max_retries`` retries of 429 and 503 (and of refused
    connections) use exponential backoff with jitter and honour Retry-After;
    nothing is retried once a streamed response has started.

    Use it as an async context manager (or call :meth:`aclose`); connections are
    pooled by httpx (HTTP/1.1) and all closed on exit.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        max_retries: int = 2,
        retry_policy: RetryPolicy | None = None,
        default_model: str | None = None,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        seed: int | None = None,
    ) -> None:
        self.base_url = _root_url(base_url)
        self.timeout = timeout
        self.default_model = default_model
        self.retry_policy = retry_policy or RetryPolicy(max_retries=max_retries)
        self._rng = random.Random(seed)
        all_headers = {"User-Agent": "sluiceway-client"}
        if api_key:
            all_headers["Authorization"] = f"Bearer {api_key}"
        all_headers.update(headers or {})
        # httpx's own timeouts are off: deadlines are trio cancel scopes only.
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=all_headers,
            timeout=None,
            transport=transport,
            http1=True,
            http2=False,
            trust_env=False,
        )
        self.chat = Chat(self)
        self.completions = Completions(self)
        self.embeddings = Embeddings(self)
        self.models = Models(self)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every pooled connection (shielded from cancellation)."""
        with trio.CancelScope(shield=True):
            await self._http.aclose()

    # ------------------------------------------------------------------ extras

    async def tokenize(
        self,
        prompt: str | list[int],
        *,
        model: str | None = None,
        timeout: Any = DEFAULT,  # noqa: ASYNC109
        **extra: Any,
    ) -> TokenizeResponse:
        """``POST /tokenize`` (sluiceway): the prompt's token ids and count."""
        body = self._body({"prompt": prompt, **extra}, model)
        return TokenizeResponse.from_dict(
            await self._request_json("POST", "/tokenize", json=body, timeout=timeout)
        )

    async def metrics(self, *, timeout: Any = DEFAULT) -> dict[str, float]:  # noqa: ASYNC109
        """``GET /metrics`` parsed into ``{"name{labels}": value}`` (comments dropped)."""
        with self._deadline(self._resolve(timeout), "GET /metrics"):
            response = await self._send("GET", "/metrics")
        samples: dict[str, float] = {}
        for line in response.text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, _, rest = line.rpartition(" ")
            try:
                samples[name] = float(rest)
            except ValueError:
                continue
        return samples

    # ----------------------------------------------------------------- fan-out

    def stream_choices(
        self,
        *,
        messages: Sequence[Any] | None = None,
        prompt: Any = None,
        model: str | None = None,
        n: int = 1,
        timeout: Any = DEFAULT,
        **params: Any,
    ) -> contextlib.AbstractAsyncContextManager[ChoiceStreams]:
        """One streamed request, split into one receive stream per choice.

        Give ``messages`` (one conversation, or a list of conversations for batch
        chat) or ``prompt`` (a string, a list of strings, token ids, or a list of
        token-id lists). There are ``prompts * n`` choices; choice ``i`` belongs to
        prompt ``i // n``. Run one consumer per choice in your own nursery::

            async with client.stream_choices(model=m, messages=convs) as choices:
                async with trio.open_nursery() as nursery:
                    for choice in choices:
                        nursery.start_soon(consume, choice)

        Each :class:`ChoiceStream` is an async iterator of that choice's chunk
        choices (``.text`` is the new text, ``.finish_reason`` is set on the
        last). A reader never blocks the others: events are routed without
        waiting. If the stream fails, every unfinished choice raises the error
        (:class:`StreamInterruptedError`, :class:`APIStreamError`,
        :class:`APITimeoutError`) when its consumer reaches it. Errors before the
        stream starts (400, 429 after retries...) raise from ``async with``.
        Leaving the block (for any reason) closes the HTTP stream, so the server
        aborts whatever is still running; it does not wait for unread choices.
        """
        return _stream_choices(
            self, messages=messages, prompt=prompt, model=model, n=n, timeout=timeout, **params
        )

    async def run_many(
        self,
        requests: Sequence[ChatCall | CompletionCall | Mapping[str, Any]],
        *,
        max_concurrency: int = 8,
        fail_fast: bool = False,
    ) -> list[Result]:
        """Run many non-streamed requests at once, at most ``max_concurrency`` in
        flight (a ``trio.CapacityLimiter``). Returns results in input order.

        A request is a :class:`ChatCall`, a :class:`CompletionCall`, or a
        dict of ``create`` arguments (``messages`` means chat, ``prompt`` means
        completions; an optional ``timeout`` key). Each request has its own
        deadline (its ``timeout``, else the client's), counted from when it gets
        a slot. A failed request's slot in the result list holds its
        :class:`APIError` (``.error`` is the OpenAI error object) and the others
        carry on; with ``fail_fast=True`` the first failure cancels the rest and
        is raised. Cancelling the caller cancels every request.
        """
        return await _run_many(self, requests, max_concurrency=max_concurrency, fail_fast=fail_fast)

    # -------------------------------------------------------------------- core

    def _resolve(self, timeout: Any) -> float | None:
        return self.timeout if timeout is DEFAULT else timeout

    def _body(self, body: Mapping[str, Any], model: str | None) -> dict[str, Any]:
        out = {k: v for k, v in body.items() if v is not None}
        model = model or self.default_model
        if model is not None:
            out = {"model": model, **out}
        return out

    @contextlib.contextmanager
    def _deadline(self, timeout: float | None, what: str) -> Iterator[None]:
        """A trio deadline whose expiry raises APITimeoutError."""
        if timeout is None:
            yield
            return
        try:
            with trio.fail_after(timeout):
                yield
        except APITimeoutError:
            raise
        except trio.TooSlowError as exc:
            raise APITimeoutError(f"timed out after {timeout} s {what}") from exc

    async def _request_json(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        timeout: Any = DEFAULT,  # noqa: ASYNC109
    ) -> Any:
        with self._deadline(self._resolve(timeout), f"{method} {path}"):
            response = await self._send(method, path, json=json)
        try:
            return response.json()
        except ValueError as exc:
            raise ResponseFormatError(
                f"{method} {path}: the response is not JSON: {response.text[:200]!r}"
            ) from exc

    async def _send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        stream: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """Send with retries; return a successful response (body read unless
        ``stream``) or raise the typed error. Call it inside a deadline."""
        attempt = 0
        while True:
            request = self._http.build_request(method, path, json=json, headers=headers)
            try:
                response = await self._http.send(request, stream=True)
            except httpx.ConnectError as exc:
                delay = self.retry_policy.delay(attempt, None, self._rng)
                if delay is None:
                    raise APIConnectionError(f"cannot connect to {self.base_url}: {exc}") from exc
            except httpx.TransportError as exc:
                raise APIConnectionError(f"{method} {path} failed: {exc}") from exc
            else:
                if response.is_success and stream:
                    return response
                try:
                    await response.aread()
                except httpx.TransportError as exc:
                    raise APIConnectionError(f"{method} {path}: response cut: {exc}") from exc
                finally:
                    await _close_response(response)
                if response.is_success:
                    return response
                error = _error_object(response)
                retry_after = parse_retry_after(response.headers.get("retry-after"))
                delay = None
                if response.status_code in RETRYABLE_STATUS:
                    delay = self.retry_policy.delay(attempt, retry_after, self._rng)
                if delay is None:
                    headers_out = {k.lower(): v for k, v in response.headers.items()}
                    raise status_error(response.status_code, error, headers_out)
            attempt += 1
            await trio.sleep(delay)


def _error_object(response: httpx.Response) -> ErrorObject:
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "error" in body:
        return ErrorObject.from_dict(body)
    text = response.text.strip() or response.reason_phrase or "error"
    return ErrorObject(text[:500], "api_error", code=response.status_code)


__all__ = ["DEFAULT", "DEFAULT_TIMEOUT", "DEFAULT_URL", "AsyncClient"]
