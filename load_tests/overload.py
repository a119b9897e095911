"""Overload: with --max-waiting small, 4x more concurrent streaming clients than the
engine runs at once. The excess must get 429 with Retry-After quickly, and the
admitted streams must keep their token pace. Compares against a run with exactly
as many clients as the engine holds.

    python load_tests/overload.py [--model DIR] --seconds 30

Writes results/overload/overload.json. Exit 1 if a 429 lacks Retry-After or any
other failure (5xx, error event, missing [DONE]) happens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).parent))
from load_server import REPO, ServerProcess
from run_load import wait_engine_empty


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 1)


class Phase:
    def __init__(self, url: str, clients: int, seconds: float, max_tokens: int) -> None:
        self.url, self.clients, self.seconds, self.max_tokens = url, clients, seconds, max_tokens
        self.ttft: list[float] = []
        self.itl: list[float] = []
        self.rejected: list[float] = []
        self.completed = 0
        self.tokens = 0
        self.failures: list[str] = []
        self.missing_retry_after = 0

    async def client(self, http: httpx.AsyncClient, k: int, deadline: float) -> None:
        body = {"messages": [{"role": "user", "content": f"Write a short story about canal lock {k}."}],
                "max_tokens": self.max_tokens, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        while time.monotonic() < deadline:
            start = time.monotonic()
            async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code == 429:
                    self.rejected.append(time.monotonic() - start)
                    retry = r.headers.get("retry-after")
                    if retry is None:
                        self.missing_retry_after += 1
                    await r.aread()
                    await trio.sleep(min(float(retry or 1), 1.0))
                    continue
                if r.status_code != 200:
                    self.failures.append(f"status {r.status_code}")
                    await r.aread()
                    continue
                last = None
                done = False
                async for line in r.aiter_lines():
                    if not line:
                        continue
                    if line == "data: [DONE]":
                        done = True
                        continue
                    obj = json.loads(line[6:])
                    if "error" in obj:
                        self.failures.append(obj["error"]["code"])
                        continue
                    now = time.monotonic()
                    if obj["choices"] and obj["choices"][0]["delta"].get("content") is not None:
                        if last is None:
                            self.ttft.append(now - start)
                        else:
                            self.itl.append(now - last)
                        last = now
                    if obj.get("usage"):
                        self.tokens += obj["usage"]["completion_tokens"]
                if done:
                    self.completed += 1
                else:
                    self.failures.append("no [DONE]")

    async def run(self) -> dict[str, Any]:
        start = time.monotonic()
        deadline = start + self.seconds
        limits = httpx.Limits(max_connections=self.clients * 2)
        async with httpx.AsyncClient(base_url=self.url, timeout=120, limits=limits) as http:
            async with trio.open_nursery() as nursery:
                for k in range(self.clients):
                    nursery.start_soon(self.client, http, k, deadline)
        elapsed = time.monotonic() - start
        return {
            "clients": self.clients, "seconds": round(elapsed, 1), "completed": self.completed,
            "goodput_tok_s": round(self.tokens / elapsed, 1),
            "ttft_ms_p50": pct(self.ttft, 0.5), "ttft_ms_p95": pct(self.ttft, 0.95),
            "itl_ms_p50": pct(self.itl, 0.5), "itl_ms_p95": pct(self.itl, 0.95),
            "itl_ms_mean": round(statistics.fmean(self.itl) * 1000, 1) if self.itl else None,
            "rejected_429": len(self.rejected),
            "reject_ms_p50": pct(self.rejected, 0.5), "reject_ms_p99": pct(self.rejected, 0.99),
            "missing_retry_after": self.missing_retry_after, "failures": self.failures[:20],
            "failure_count": len(self.failures),
        }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model dir or .gguf (default: the default model)")
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--max-waiting", type=int, default=4)
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--out", default=str(REPO / "results" / "overload"))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    flags = ["--max-num-seqs", str(args.max_num_seqs), "--max-waiting", str(args.max_waiting),
             "--num-kv-blocks", "1024"] + (["--model", args.model] if args.model else [])
    with ServerProcess.sluiceway(flags, out / "server.log") as server:
        print(f"server pid {server.pid} at {server.url}", flush=True)
        base = trio.run(Phase(server.url, args.max_num_seqs, args.seconds, args.max_tokens).run)
        print("baseline", json.dumps(base), flush=True)
        over = trio.run(Phase(server.url, 4 * args.max_num_seqs, args.seconds, args.max_tokens).run)
        print("overload", json.dumps(over), flush=True)
        leftovers = wait_engine_empty(server.url)
    report = {"server_flags": flags, "baseline": base, "overload": over,
              "engine_at_end": {k: v for k, v in leftovers.items() if k in (
                  "sluiceway_requests_running", "sluiceway_requests_waiting", "sluiceway_kv_cache_blocks_used")}}
    (out / "overload.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    ok = (base["failure_count"] == 0 and over["failure_count"] == 0 and over["missing_retry_after"] == 0
          and all(v == 0 for v in report["engine_at_end"].values()))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
