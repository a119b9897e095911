"""Soak: a long mixed workload against a real server subprocess serving a small
random-weight Llama (built here with transformers, saved as an HF model directory
with the default model's tokenizer). Proves nothing leaks.

    python load_tests/soak.py --requests 5000 --concurrency 32

Mix: 30% of clients hang up at a random point of a stream, 10% ask for more than
the server's --request-timeout allows (they hit the deadline: 504 or an in-stream
timeout event), 5% send bad input (expect 4xx), the rest are ordinary streaming and
non-streaming chat/completions (some n=2); under full load some of these also
outlive the 2 s deadline, and a clean 504/timeout event is then the right answer
(counted apart). Reports requests served, errors by type,
/metrics at the end (running, waiting, KV blocks used: all must be 0), and the
server's RSS, threads and open fds at start, middle and end. The server exposes no
trio task count, so threads and fds stand in for leaked tasks/connections.
Writes results/soak/soak.json; exit 1 on any unexpected outcome or leftover.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).parent))
from load_server import REPO, ServerProcess, metrics
from run_load import save_default_tokenizer, wait_engine_empty

REQUEST_TIMEOUT = 2.0
BAD = [
    b'{"messages": [{"role": "user", "content": "x"}], "n": 0}',
    b'{"prompt": "x", "temperature": -3}',
    b'{"prompt": "x", "max_tokens": "lots"}',
    b"{oops",
    b'{"messages": "not a list"}',
    b'{"prompt": [99999999]}',
]


def build_model(path: Path, seed: int = 0) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
    )
    LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    save_default_tokenizer(path)
    return path


class Soak:
    def __init__(self, url: str, server: ServerProcess, total: int, seed: int) -> None:
        self.url = url
        self.server = server
        self.total = total
        self.rng = random.Random(seed)
        self.next = 0
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.unexpected: collections.Counter[str] = collections.Counter()
        self.samples: dict[str, dict[str, int]] = {}
        self.tokens = 0

    def sample(self, label: str) -> None:
        self.samples[label] = {"rss_kib": self.server.rss_kib(), "threads": self.server.threads(),
                               "open_fds": self.server.open_fds(), "done": self.next}

    async def worker(self, client: httpx.AsyncClient) -> None:
        while self.next < self.total:
            i = self.next
            self.next += 1
            if i == self.total // 2:
                self.sample("middle")
            try:
                kind = await self.one(client, self.rng.random())
                self.outcomes[kind] += 1
            except Exception as exc:
                self.unexpected[f"{type(exc).__name__}"] += 1

    def _body(self, chat: bool, **kw: Any) -> dict[str, Any]:
        text = f"Tell me about item {self.rng.randint(0, 10**6)}." + " More." * self.rng.randint(0, 20)
        base = {"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text}
        return base | kw

    async def one(self, client: httpx.AsyncClient, roll: float) -> str:
        chat = self.rng.random() < 0.6
        path = "/v1/chat/completions" if chat else "/v1/completions"
        if roll < 0.30:  # hang up at a random point
            body = self._body(chat, max_tokens=200, n=self.rng.choice([1, 2]), stream=True)
            stop_after = self.rng.randint(0, 20)
            async with client.stream("POST", path, json=body) as r:
                seen = 0
                async for _ in r.aiter_lines():
                    seen += 1
                    if seen > stop_after:
                        break
            return "disconnected"
        if roll < 0.40:  # hit the server's deadline
            body = self._body(chat, max_tokens=1500, ignore_eos=True, stream=self.rng.random() < 0.5)
            if body["stream"]:
                async with client.stream("POST", path, json=body) as r:
                    text = (await r.aread()).decode()
                return "timeout (in-stream)" if "request_timeout" in text else self._bad_outcome(f"deadline stream {r.status_code}")
            r = await client.post(path, json=body)
            return "timeout (504)" if r.status_code == 504 else self._bad_outcome(f"deadline {r.status_code}")
        if roll < 0.45:
            r = await client.post(path, content=self.rng.choice(BAD), headers={"content-type": "application/json"})
            return "bad input rejected (4xx)" if 400 <= r.status_code < 500 and "error" in r.json() else self._bad_outcome(f"bad input {r.status_code}")
        body = self._body(chat, max_tokens=self.rng.randint(1, 32), n=self.rng.choice([1, 1, 2]))
        if self.rng.random() < 0.5:
            async with client.stream("POST", path, json=body | {"stream": True}) as r:
                text = (await r.aread()).decode()
            if r.status_code == 200 and "request_timeout" in text and text.rstrip().endswith("data: [DONE]"):
                return "ordinary, timed out under load (in-stream)"
            if r.status_code != 200 or '"error"' in text or not text.rstrip().endswith("data: [DONE]"):
                return self._bad_outcome(f"stream {r.status_code} {text[-120:]!r}")
            return "served (stream)"
        r = await client.post(path, json=body)
        if r.status_code == 504 and r.json()["error"]["code"] == "request_timeout":
            return "ordinary, timed out under load (504)"
        if r.status_code != 200:
            return self._bad_outcome(f"{r.status_code} {r.text[:120]}")
        self.tokens += r.json()["usage"]["completion_tokens"]
        return "served"

    def _bad_outcome(self, what: str) -> str:
        self.unexpected[what[:80]] += 1
        return "unexpected"


async def run_soak(url: str, server: ServerProcess, total: int, concurrency: int, seed: int) -> Soak:
    soak = Soak(url, server, total, seed)
    soak.sample("start")
    limits = httpx.Limits(max_connections=concurrency * 2)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(soak.worker, client)
    return soak


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=str(REPO / "results" / "soak"))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp) / "tiny-llama")
        flags = ["--model", str(model), "--dtype", "float32", "--max-num-seqs", "32",
                 "--num-kv-blocks", "1024", "--max-waiting", "1024",
                 "--request-timeout", str(REQUEST_TIMEOUT), "--served-model-name", "tiny"]
        server = ServerProcess.sluiceway(flags, out / "server.log").start()
        print(f"server pid {server.pid} at {server.url}", flush=True)
        try:
            started = time.monotonic()
            soak = trio.run(run_soak, server.url, server, args.requests, args.concurrency, args.seed)
            elapsed = time.monotonic() - started
            m = wait_engine_empty(server.url)
            soak.sample("end")
            end_metrics = metrics(server.url)
        finally:
            code = server.stop()
    keys = ("sluiceway_requests_running", "sluiceway_requests_waiting", "sluiceway_kv_cache_blocks_used")
    report = {
        "requests": args.requests, "concurrency": args.concurrency, "seconds": round(elapsed, 1),
        "outcomes": dict(soak.outcomes), "unexpected": dict(soak.unexpected),
        "engine_at_end": {k: m.get(k) for k in keys},
        "finished_by_reason": {k: v for k, v in end_metrics.items() if k.startswith("sluiceway_requests_finished_total")},
        "preemptions": end_metrics.get("sluiceway_preemptions_total"),
        "generation_tokens": end_metrics.get("sluiceway_generation_tokens_total"),
        "process": soak.samples, "server_exit_code": code,
    }
    (out / "soak.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    ok = not soak.unexpected and all(v == 0 for v in report["engine_at_end"].values()) and code == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
