"""Client-side helpers for the reliability tests: SSE parsing, raw sockets, polling."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs
import httpx
import trio

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@attrs.define
class StreamResult:
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
        return {
            i: "".join((c["delta"].get("content") or "") if "delta" in c else c["text"] for c in cs)
            for i, cs in self.by_index().items()
        }

    def finish_reasons(self) -> dict[int, str | None]:
        return {i: cs[-1]["finish_reason"] for i, cs in self.by_index().items()}

    def usage(self) -> dict[str, Any] | None:
        with_usage = [c for c in self.chunks if c.get("usage")]
        return with_usage[-1]["usage"] if with_usage else None


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
    obj = json.loads(data)  # a cut event would fail here
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


async def eventually(predicate: Callable[[], bool], limit_s: float = 10.0) -> None:
    """Wait until `predicate()` holds, for state on the far side of a socket or in the
    engine's worker thread; the limit only turns a hang into a failure."""
    with trio.fail_after(limit_s):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.005)


def chat(content: str, **kw: Any) -> dict[str, Any]:
    return {"model": "test-model", "messages": [{"role": "user", "content": content}]} | kw


def completion(prompt: Any, **kw: Any) -> dict[str, Any]:
    return {"model": "test-model", "prompt": prompt} | kw


class RawStream:
    """A bare HTTP/1.1 request over a trio socket: send part of it, read part of the
    answer, or never read, then hang up."""

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
        while True:
            chunk = await self.sock.receive_some(65536)
            if not chunk:
                return
            self.buffer += chunk

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
