"""Client-side helpers for tests that drive a real server: SSE parsing, raw sockets,
polling across a socket, request bodies, and metric/engine readings."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import attrs
import httpx
import trio

from sluiceway.engine.batch import ScheduledChunk

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@attrs.define
class StreamResult:
    """A parsed SSE response: chunks (dicts), error events, and whether [DONE] came last."""

    status: int
    chunks: list[dict[str, Any]] = attrs.field(factory=list)
    errors: list[dict[str, Any]] = attrs.field(factory=list)
    done: bool = False
    after_done: int = 0

    def by_index(self) -> dict[int, list[dict[str, Any]]]:
        out: dict[int, list[dict[str, Any]]] = {}
        for chunk in self.chunks:
            for choice in chunk["choices"]:
                out.setdefault(choice["index"], []).append(choice)
        return out

    def texts(self) -> dict[int, str]:
        out = {}
        for index, choices in self.by_index().items():
            parts = [
                c["delta"].get("content") or "" if "delta" in c else c["text"] for c in choices
            ]
            out[index] = "".join(parts)
        return out

    def finish_reasons(self) -> dict[int, str | None]:
        return {i: cs[-1]["finish_reason"] for i, cs in self.by_index().items()}

    def usage(self) -> dict[str, Any] | None:
        with_usage = [c for c in self.chunks if c.get("usage")]
        return with_usage[-1]["usage"] if with_usage else None

    def check_well_formed(self) -> None:
        """Each choice: role first (chat), finish_reason only on its last chunk; [DONE] last."""
        assert self.done and self.after_done == 0, (self.done, self.after_done, self.errors)
        for choices in self.by_index().values():
            if "delta" in choices[0]:
                assert choices[0]["delta"].get("role") == "assistant"
                assert all("role" not in c["delta"] for c in choices[1:])
            assert all(c["finish_reason"] is None for c in choices[:-1])


def parse_event(line: str, result: StreamResult) -> None:
    if not line:
        return
    assert line.startswith("data: "), line
    data = line[len("data: ") :]
    if result.done:
        result.after_done += 1
    if data == "[DONE]":
        result.done = True
        return
    obj = json.loads(data)
    if "error" in obj:
        result.errors.append(obj["error"])
    else:
        result.chunks.append(obj)


async def stream(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> StreamResult:
    async with client.stream("POST", path, json=body | {"stream": True}) as response:
        result = StreamResult(response.status_code)
        if response.status_code != 200:
            await response.aread()
            result.errors.append(response.json()["error"])
            return result
        async for line in response.aiter_lines():
            parse_event(line, result)
    return result


def chat(content: str, **kw: Any) -> dict[str, Any]:
    return {"model": "test-model", "messages": [{"role": "user", "content": content}]} | kw


def completion(prompt: Any, **kw: Any) -> dict[str, Any]:
    return {"model": "test-model", "prompt": prompt} | kw


class RawStream:
    """A bare HTTP/1.1 request over a trio socket, for reading part of a response and
    hanging up (httpx's nested async generators can't be abandoned cleanly)."""

    def __init__(self, sock: trio.SocketStream) -> None:
        self.sock = sock
        self.buffer = b""

    @classmethod
    async def connect(cls, url: str) -> RawStream:
        host, port = url.removeprefix("http://").split(":")
        return cls(await trio.open_tcp_stream(host, int(port)))

    @staticmethod
    def request_bytes(url: str, path: str, body: dict[str, Any]) -> bytes:
        host = url.removeprefix("http://")
        data = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
        ).encode()
        return head + data

    @classmethod
    async def post(cls, url: str, path: str, body: dict[str, Any]) -> RawStream:
        raw = await cls.connect(url)
        await raw.sock.send_all(cls.request_bytes(url, path, body))
        return raw

    async def read_until(self, predicate: Callable[[bytes], bool]) -> None:
        while not predicate(self.buffer):
            chunk = await self.sock.receive_some(65536)
            if not chunk:
                raise EOFError(self.buffer[-500:])
            self.buffer += chunk

    async def read_to_end(self) -> None:
        """Until the chunked body's last chunk (or EOF)."""
        while not self.buffer.endswith(b"\r\n0\r\n\r\n"):
            chunk = await self.sock.receive_some(65536)
            if not chunk:
                return
            self.buffer += chunk

    def events(self) -> StreamResult:
        """Parse the SSE events out of the (chunked) body read so far."""
        head, _, body = self.buffer.partition(b"\r\n\r\n")
        result = StreamResult(int(head.split(b" ")[1]))
        for line in body.split(b"\n"):
            line = line.strip(b"\r")
            if line.startswith(b"data: "):
                parse_event(line.decode(), result)
        return result

    def status(self) -> int:
        return int(self.buffer.split(b" ", 2)[1])

    async def aclose(self) -> None:
        await self.sock.aclose()


def count_content(buffer: bytes) -> int:
    return buffer.count(b'"delta":{"content":') + buffer.count(b'"text":')


def finished(server: Any, reason: str) -> float:
    value = server.state.metrics.registry.get_sample_value(
        "sluiceway_requests_finished_total", {"reason": reason}
    )
    return value or 0.0


def finished_total(server: Any) -> float:
    return sum(finished(server, r) for r in ("stop", "length", "abort", "timeout", "error"))


def engine_empty(server: Any) -> bool:
    s = server.state.engine.stats()
    return s.num_running_seqs == 0 and s.num_waiting_seqs == 0 and s.kv_blocks_used == 0


def scripted_token(vocab: tuple[int, ...], chunk: ScheduledChunk) -> int:
    """The scripted runners' next token: `vocab[(last token + position) % len(vocab)]`,
    a function of the sequence alone, so a prompt's answer is the same alone, in any
    batch, or after preemption and recompute."""
    position = chunk.start_pos + len(chunk.token_ids)
    return vocab[(chunk.token_ids[-1] + position) % len(vocab)]


@attrs.define
class StepGate:
    """Gating for the scripted runners (mixed in; its fields are keyword-only).
    With `gated`, each step waits in `wait_for_permit` for a permit (`allow(k)`);
    `open()` (also `release()`, which the shared server fixture calls on teardown)
    lets every step through for good. Steps run in the engine's worker thread."""

    gated: bool = attrs.field(default=False, kw_only=True)
    _permits: threading.Semaphore = attrs.field(
        factory=lambda: threading.Semaphore(0), kw_only=True
    )
    _open: threading.Event = attrs.field(factory=threading.Event, kw_only=True)

    def allow(self, steps: int = 1) -> None:
        self._permits.release(steps)

    def open(self) -> None:
        self._open.set()
        self._permits.release(1_000_000)

    release = open

    def wait_for_permit(self) -> None:
        if self.gated and not self._open.is_set():
            self._permits.acquire()

    def wait_until_open(self) -> None:
        self._open.wait()
