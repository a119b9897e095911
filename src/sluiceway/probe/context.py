"""What a scenario works with: the server, its model, the load ledger, a place for
its numbers, and streams that record every chunk's arrival."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import attrs
import httpx
import trio

from sluiceway.client import APIStatusError, AsyncClient, Stream
from sluiceway.probe.gauges import Gauges, read_gauges
from sluiceway.probe.ledger import Ledger
from sluiceway.probe.record import StreamRecord

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
# Statuses that mean "this server does not do that" rather than "it broke".
UNSUPPORTED_STATUS = frozenset({400, 404, 405, 415, 422, 501})
# The receive buffer of a reader that stops reading: small, so the server's side
# fills after kilobytes rather than megabytes.
SMALL_RECEIVE_BUFFER = 4096


class UnsupportedError(Exception):
    """The server refused what the scenario needs; the verdict is "not supported"."""


@attrs.frozen
class Outcome:
    """A scenario's verdict: ``passed`` and a one-line reason."""

    passed: bool
    reason: str


def _raw(chunk: dict[str, Any]) -> dict[str, Any]:
    return chunk


@attrs.define
class ProbeContext:
    """One scenario's view of the server. ``numbers`` gathers everything it
    measures (the JSON report prints all of it); ``progress`` says what it is
    waiting for, which becomes the reason if the scenario's bound expires."""

    url: str
    model: str
    api_key: str | None
    client: AsyncClient
    ledger: Ledger
    bound_s: float
    use_metrics: bool = True
    numbers: dict[str, Any] = attrs.field(factory=dict)
    records: list[StreamRecord] = attrs.field(factory=list)
    progress: str | Callable[[], str] = "starting"

    def describe_progress(self) -> str:
        return self.progress() if callable(self.progress) else self.progress

    def now(self) -> float:
        return trio.current_time()

    def chat(self, content: str, max_tokens: int, **kw: Any) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            **kw,
        }

    def completion(self, prompt: Any, max_tokens: int, **kw: Any) -> dict[str, Any]:
        return {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, **kw}

    @asynccontextmanager
    async def stream(
        self, path: str, body: dict[str, Any], *, client: AsyncClient | None = None
    ) -> AsyncIterator[tuple[Stream[dict[str, Any]], StreamRecord]]:
        """Send one streamed request and hold it open for the block; the response
        is closed (the server sees the disconnect) when the block exits for any
        reason, cancellation included. A refusal raises the client's typed error."""
        with self.ledger.request(path, {**body, "stream": True}):
            stream = Stream(client or self.client, path, {**body, "stream": True}, _raw, None)
            record = StreamRecord(opened_at=self.now())
            self.records.append(record)
            async with stream:
                yield stream, record

    async def read(
        self,
        stream: Stream[dict[str, Any]],
        record: StreamRecord,
        on_chunk: Callable[[StreamRecord, list[int]], None] | None = None,
        *,
        stop_after: int | None = None,
    ) -> None:
        """Read chunks into ``record`` until ``[DONE]`` (or ``stop_after`` chunks),
        calling ``on_chunk`` after each. Stream errors propagate."""
        async for chunk in stream:
            indices = record.add(chunk, self.now())
            if on_chunk is not None:
                on_chunk(record, indices)
            if stop_after is not None and record.chunks >= stop_after:
                return
        record.done = stream.completed
        record.closed_at = self.now()

    async def request_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One non-streamed request; its JSON body."""
        with self.ledger.request(path, body):
            result: dict[str, Any] = await self.client._request_json(
                "POST", path, json=body, timeout=None
            )
            return result

    async def gauges(self) -> Gauges | None:
        """The server's running/waiting gauges; None without them or when the
        probe was told to judge by the streams alone."""
        return await read_gauges(self.client) if self.use_metrics else None

    def small_buffer_client(self) -> AsyncClient:
        """A second client whose connections have a small receive buffer."""
        transport = httpx.AsyncHTTPTransport(
            socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_RECEIVE_BUFFER)]
        )
        return AsyncClient(self.url, self.api_key, timeout=None, max_retries=0, transport=transport)


@contextmanager
def refusal_means_unsupported(what: str) -> Iterator[None]:
    """Turn a 4xx refusal of ``what`` into "not supported" (with the server's words)."""
    try:
        yield
    except (APIStatusError, BaseExceptionGroup) as exc:
        refusal = next(
            (
                e
                for e in leaves(exc)
                if isinstance(e, APIStatusError) and e.status_code in UNSUPPORTED_STATUS
            ),
            None,
        )
        if refusal is None:
            raise
        raise UnsupportedError(
            f"{what}: HTTP {refusal.status_code} {refusal.message[:120]}"
        ) from exc


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, or ``[exc]``."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]
