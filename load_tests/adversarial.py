"""Adversarial clients against a server process, one attack after another, each
followed by the same checks: `/health` answers within 100 ms, nothing is left
running or waiting and no KV block is held, open file descriptors are back at
their baseline (plus a small margin) and RSS within a stated bound of it. At the
end, SIGTERM must stop the process with exit code 0 within `--drain-grace` plus
a second (a few more on a loaded machine, `--exit-margin`).

    python load_tests/adversarial.py [--model PATH | --fake] [--out results/adversarial]

Every attack is bounded in count and time and sends only to the loopback server
it starts. Writes `adversarial.json` (per attack: what it did, the checks, pass
or fail). Exit 1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).parent))
from load_server import REPO, ServerProcess, metrics

CHAT = "/v1/chat/completions"
FD_MARGIN = 8
RSS_MARGIN_MIB = 200
KEEP_ALIVE_S = 1.0
GRACE_S = 2.0


def _body(content: str = "hello", **kw: Any) -> bytes:
    request = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 16}
    return json.dumps(request | kw).encode()


def _head(method: str, path: str, length: int | None, extra: str = "") -> bytes:
    size = f"Content-Length: {length}\r\n" if length is not None else ""
    return f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{size}{extra}\r\n".encode()


class Attacks:
    """Each attack opens what it needs, does its damage within a few seconds, and
    closes everything it opened."""

    def __init__(self, url: str) -> None:
        self.url = url
        host, port = url.removeprefix("http://").split(":")
        self.address = (host, int(port))

    async def connect(self, receive_buffer: int | None = None) -> trio.SocketStream:
        sock = trio.socket.socket()
        if receive_buffer:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        await sock.connect(self.address)
        return trio.SocketStream(sock)

    async def read_some(self, stream: trio.SocketStream, seconds: float = 5.0) -> bytes:
        with trio.move_on_after(seconds):
            return await stream.receive_some(65536)
        return b""

    async def early_replies_with_late_bodies(self) -> tuple[str, bool]:
        body = _body()
        answered = 0
        for method, path in [("POST", "/v1/responses"), ("PUT", CHAT), ("GET", "/v1/models")] * 5:
            stream = await self.connect()
            await stream.send_all(_head(method, path, len(body)))
            await self.read_some(stream)
            await stream.send_all(body)
            await stream.send_all(_head("GET", "/v1/models", 0))
            reply = b""
            with trio.move_on_after(5):
                while b"HTTP/1.1 200" not in reply:
                    reply += await stream.receive_some(65536)
            answered += b"HTTP/1.1 200" in reply
            await stream.aclose()
        return f"{answered}/15 connections answered their next request", answered == 15

    async def idle_keep_alive(self) -> tuple[str, bool]:
        streams = []
        for _ in range(200):
            stream = await self.connect()
            await stream.send_all(_head("GET", "/v1/models", None))
            streams.append(stream)
        closed = 0
        with trio.move_on_after(KEEP_ALIVE_S + 5):
            for stream in streams:
                while await stream.receive_some(65536):
                    pass
                closed += 1
        for stream in streams:
            await stream.aclose()
        return f"{closed}/200 idle connections closed by the server", closed == 200

    async def silent_connections(self) -> tuple[str, bool]:
        streams = [await self.connect() for _ in range(300)]
        ok = await self.health_ms()
        for stream in streams:
            await stream.aclose()
        return f"300 silent connections; /health took {ok:.1f} ms meanwhile", ok < 100

    async def slowloris_headers(self) -> tuple[str, bool]:
        streams = [await self.connect() for _ in range(50)]
        worst, cut = 0.0, set()
        for i in range(40):
            for k, stream in enumerate(streams):
                line = f"X-Slow-{i}: {'a' * 10}\r\n".encode() if i else b"GET / HTTP/1.1\r\n"
                try:
                    await stream.send_all(line)
                except trio.BrokenResourceError:
                    cut.add(k)  # the server stopped waiting for the rest: held
            worst = max(worst, await self.health_ms())
            await trio.sleep(0.05)
        for stream in streams:
            await stream.aclose()
        held = worst < 100 and len(cut) == len(streams)
        return f"50 connections dripping headers for 2 s: {len(cut)} cut off; worst /health {worst:.1f} ms", held

    async def non_reading_streams(self) -> tuple[str, bool]:
        streams = []
        for _ in range(4):
            stream = await self.connect(receive_buffer=4096)
            body = _body("flood", max_tokens=600, n=8, stream=True, logprobs=True, top_logprobs=5)
            await stream.send_all(_head("POST", CHAT, len(body)) + body)
            streams.append(stream)
        reset = 0
        with trio.move_on_after(20):  # the stall bound is 2 s in this run
            for stream in streams:
                try:
                    await trio.sleep(3)
                    while await stream.receive_some(65536):
                        pass
                except trio.BrokenResourceError:
                    pass
                reset += 1
        for stream in streams:
            await stream.aclose()
        return f"{reset}/4 streams that were never read were cut off", reset == 4

    async def rst_storm(self) -> tuple[str, bool]:
        for _ in range(100):
            stream = await self.connect()
            body = _body("storm", max_tokens=200, stream=True)
            await stream.send_all(_head("POST", CHAT, len(body)) + body)
            await self.read_some(stream, 1)
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            await stream.aclose()
        return "100 streams reset right after their first bytes", True

    async def pipelining_and_bad_framing(self) -> tuple[str, bool]:
        stream = await self.connect()
        await stream.send_all(_head("GET", "/v1/models", 0) * 20)
        got = b""
        with trio.move_on_after(5):
            while got.count(b"HTTP/1.1 200") < 20:
                got += await stream.receive_some(65536)
        await stream.aclose()
        for bad in [
            _head("POST", CHAT, None, "Transfer-Encoding: chunked\r\n") + b"zz\r\nxx\r\n",
            _head("POST", CHAT, 5, "Transfer-Encoding: chunked\r\n") + b"0\r\n\r\n",
            b"GET / HTTP/1.1\r\n" + b"X: " + b"a" * 100_000 + b"\r\n\r\n",
        ]:
            stream = await self.connect()
            try:
                await stream.send_all(bad)
                await self.read_some(stream, 2)
            except trio.BrokenResourceError:
                pass
            await stream.aclose()
        answered = got.count(b"HTTP/1.1 200")
        return f"{answered}/20 pipelined answered; 3 malformed requests sent", answered == 20

    async def heavy_and_greedy_requests(self) -> tuple[str, bool]:
        async with httpx.AsyncClient(base_url=self.url, timeout=60) as client:
            many = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": ""}] * 20_000}
            heavy = (await client.post(CHAT, json=many)).status_code
            greedy = (await client.post("/v1/completions", json={"model": "m", "prompt": ["a"] * 5, "n": 64, "max_tokens": 2})).status_code
            nan = (await client.post(CHAT, content=b'{"model": "m", "messages": [], "temperature": NaN}', headers={"content-type": "application/json"})).status_code
        statuses = (heavy, greedy, nan)
        return f"20,000 messages: {heavy}; 5 prompts x n=64: {greedy}; NaN: {nan}", 500 not in statuses

    async def health_ms(self) -> float:
        """One `/health` request on a new connection, timed from connect to answer
        (the client's own set-up, tens of milliseconds for httpx, is left out)."""
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as client:
            start = time.perf_counter()
            await client.get("/health")
            return (time.perf_counter() - start) * 1000


async def _settle(server: ServerProcess, attacks: Attacks, baseline: dict[str, float]) -> dict[str, Any]:
    """The checks after an attack, once the server has had up to 15 s to settle."""
    deadline = time.monotonic() + 15
    while True:
        m = await trio.to_thread.run_sync(metrics, server.url)
        state = {
            "running": m.get("sluiceway_requests_running", -1),
            "waiting": m.get("sluiceway_requests_waiting", -1),
            "kv_blocks_used": m.get("sluiceway_kv_cache_blocks_used", -1),
            "open_fds": server.open_fds(),
            "rss_mib": round(server.rss_kib() / 1024, 1),
        }
        ok = (
            state["running"] == 0
            and state["waiting"] == 0
            and state["kv_blocks_used"] == 0
            and state["open_fds"] <= baseline["open_fds"] + FD_MARGIN
            and state["rss_mib"] <= baseline["rss_mib"] + RSS_MARGIN_MIB
        )
        if ok or time.monotonic() > deadline:
            break
        await trio.sleep(0.2)
    health = min([await attacks.health_ms() for _ in range(5)])
    state["health_ms"] = round(health, 1)
    state["ok"] = ok and health < 100
    return state


async def run(server: ServerProcess) -> list[dict[str, Any]]:
    attacks = Attacks(server.url)
    baseline = {"open_fds": server.open_fds(), "rss_mib": server.rss_kib() / 1024}
    results: list[dict[str, Any]] = []
    plan: list[tuple[str, Callable[[], Awaitable[tuple[str, bool]]]]] = [
        ("early replies with late bodies", attacks.early_replies_with_late_bodies),
        ("idle keep-alive connections", attacks.idle_keep_alive),
        ("silent connections", attacks.silent_connections),
        ("slowloris headers", attacks.slowloris_headers),
        ("streams never read", attacks.non_reading_streams),
        ("RST storm", attacks.rst_storm),
        ("pipelining and bad framing", attacks.pipelining_and_bad_framing),
        ("heavy and greedy requests", attacks.heavy_and_greedy_requests),
    ]
    for name, attack in plan:
        with trio.fail_after(120):
            did, held = await attack()
        after = await _settle(server, attacks, baseline)
        after["ok"] = after["ok"] and held
        results.append({"attack": name, "did": did, **after})
        print(f"{'ok  ' if after['ok'] else 'FAIL'} {name}: {did}; {after}", flush=True)
    start = time.monotonic()
    server.signal()
    code = await trio.to_thread.run_sync(server.wait, GRACE_S + 30)
    took = time.monotonic() - start
    exit_ok = code == 0 and took <= GRACE_S + 1 + _EXIT_MARGIN[0]
    results.append({"attack": "SIGTERM", "exit_code": code, "seconds": round(took, 2), "ok": exit_ok})
    print(f"{'ok  ' if exit_ok else 'FAIL'} SIGTERM: exit {code} after {took:.2f} s", flush=True)
    return results


_EXIT_MARGIN = [0.0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fake", action="store_true", help="a scripted model (load_tests/fake_server.py)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory for --fake")
    p.add_argument("--model", default=None, help="model path (default: the embedded model)")
    p.add_argument("--exit-margin", type=float, default=2.0, help="extra seconds allowed for the exit")
    p.add_argument("--out", type=Path, default=REPO / "results" / "adversarial")
    args = p.parse_args()
    _EXIT_MARGIN[0] = args.exit_margin
    flags = [
        "--drain-grace", str(GRACE_S),
        "--keep-alive-timeout", str(KEEP_ALIVE_S),
        "--send-stall-timeout", "2",
    ]
    log = args.out / "server.log"
    if args.fake:
        if not args.tokenizer:
            p.error("--fake needs --tokenizer DIR")
        server = ServerProcess.fake(args.tokenizer, [*flags, "--step-delay", "0.002"], log, start_limit_s=60)
    else:
        model = ["--model", args.model] if args.model else []
        server = ServerProcess.sluiceway([*flags, *model, "--max-num-seqs", "32"], log)
    server.start()
    try:
        results = trio.run(run, server)
    finally:
        server.stop(10)
    (args.out / "adversarial.json").write_text(json.dumps(results, indent=2))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
