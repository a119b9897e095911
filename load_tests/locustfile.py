"""Realistic sluiceway users for locust.

Request events (next to locust's own whole-request time):
  TTFT  <name>   time to a choice's first content token (ms)
  ITL   <name>   gap between successive token chunks of one choice (ms)
  E2E   <name>   whole streamed request, first byte sent to [DONE] (ms)
Any malformed stream, missing [DONE], error event, 5xx or unexpected status is a
failure. Environment: LOAD_MAX_TOKENS (default 48) caps max_tokens.

    locust -f load_tests/locustfile.py --host http://127.0.0.1:8000 --headless -u 8 -r 4 -t 60s
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

from locust import HttpUser, between, task

MAX_TOKENS = int(os.environ.get("LOAD_MAX_TOKENS", "48"))
TOPICS = [
    "the river", "a quiet bridge", "trio nurseries", "paged attention", "why the sky is blue",
    "a haiku about load tests", "the history of canals", "sluice gates", "streams and channels",
]
STYLES = ["Explain", "Write two sentences about", "Summarize", "List three facts about", "Describe"]


def _prompt(rng: random.Random) -> str:
    text = f"{rng.choice(STYLES)} {rng.choice(TOPICS)}."
    return text + " Be brief." * rng.randint(0, 3)


class _Base(HttpUser):
    abstract = True
    wait_time = between(0.05, 0.3)
    model = "unknown"

    def on_start(self) -> None:
        self.rng = random.Random()
        r = self.client.get("/v1/models", name="/v1/models")
        self.model = r.json()["data"][0]["id"]

    def _event(self, kind: str, name: str, ms: float, exc: Exception | None = None) -> None:
        self.environment.events.request.fire(
            request_type=kind, name=name, response_time=ms, response_length=0,
            exception=exc, context={},
        )

    def stream(self, path: str, body: dict[str, Any], name: str, stop_after: int | None = None) -> None:
        """Stream a request; check it; fire TTFT/ITL/E2E. `stop_after`: hang up after
        that many content chunks (a disconnecting user)."""
        start = time.perf_counter()
        expected = body.get("n", 1) * body.get("_prompts", 1)
        body = {k: v for k, v in body.items() if not k.startswith("_")}
        with self.client.post(path, json=body | {"stream": True}, stream=True,
                              catch_response=True, name=name) as resp:
            if resp.status_code != 200:
                resp.failure(f"status {resp.status_code}: {resp.text[:200]}")
                return
            first: dict[int, float] = {}
            last: dict[int, float] = {}
            finished: set[int] = set()
            done = False
            chunks = 0
            for raw in resp.iter_lines():
                if not raw:
                    continue
                line = raw.decode()
                if not line.startswith("data: "):
                    resp.failure(f"not an SSE data line: {line[:100]}")
                    return
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    continue
                if done:
                    resp.failure("event after [DONE]")
                    return
                obj = json.loads(data)
                if "error" in obj:
                    resp.failure(f"error event: {obj['error']}")
                    return
                now = time.perf_counter()
                for choice in obj["choices"]:
                    i = choice["index"]
                    text = choice.get("text") or (choice.get("delta") or {}).get("content")
                    if text:
                        chunks += 1
                        if i not in first:
                            first[i] = now
                            self._event("TTFT", name, (now - start) * 1000)
                        else:
                            self._event("ITL", name, (now - last[i]) * 1000)
                        last[i] = now
                    if choice.get("finish_reason"):
                        finished.add(i)
                if stop_after is not None and chunks >= stop_after:
                    resp.close()  # hang up mid-stream
                    resp.success()
                    return
            if stop_after is not None:
                resp.success()  # the answer ended before we meant to hang up
                return
            if not done or len(finished) != expected:
                resp.failure(f"[DONE]={done}, {len(finished)}/{expected} choices finished")
                return
            resp.success()
            self._event("E2E", name, (time.perf_counter() - start) * 1000)


class StreamingChatUser(_Base):
    weight = 4

    @task
    def chat(self) -> None:
        n = self.rng.choice([1, 1, 1, 2, 3])
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": _prompt(self.rng)}],
            "n": n,
            "max_tokens": self.rng.randint(4, MAX_TOKENS),
            "temperature": self.rng.choice([0.0, 0.7, 1.0]),
            "stream_options": {"include_usage": True},
        }
        self.stream("/v1/chat/completions", body, f"chat stream n={n}")


class CompletionUser(_Base):
    weight = 2

    @task
    def complete(self) -> None:
        body = {"model": self.model, "prompt": _prompt(self.rng),
                "max_tokens": self.rng.randint(4, MAX_TOKENS), "temperature": 0.0}
        with self.client.post("/v1/completions", json=body, catch_response=True,
                              name="completion") as resp:
            if resp.status_code != 200:
                resp.failure(f"status {resp.status_code}: {resp.text[:200]}")
            elif resp.json()["choices"][0]["finish_reason"] not in ("stop", "length"):
                resp.failure(f"finish_reason {resp.json()['choices'][0]['finish_reason']}")


class BatchUser(_Base):
    weight = 1

    @task
    def batch_completions(self) -> None:
        prompts = [_prompt(self.rng) for _ in range(self.rng.randint(2, 4))]
        body = {"model": self.model, "prompt": prompts, "n": 2,
                "max_tokens": self.rng.randint(4, MAX_TOKENS // 2 + 4), "_prompts": len(prompts)}
        self.stream("/v1/completions", body, "batch completions stream")

    @task
    def batch_chat(self) -> None:
        convs = [[{"role": "user", "content": _prompt(self.rng)}] for _ in range(3)]
        body = {"model": self.model, "messages": convs, "max_tokens": self.rng.randint(4, MAX_TOKENS // 2 + 4)}
        with self.client.post("/v1/chat/completions", json=body, catch_response=True,
                              name="batch chat") as resp:
            if resp.status_code != 200 or len(resp.json()["choices"]) != 3:
                resp.failure(f"status {resp.status_code}: {resp.text[:200]}")


class DisconnectingUser(_Base):
    weight = 1

    @task
    def hang_up(self) -> None:
        body = {"model": self.model, "messages": [{"role": "user", "content": _prompt(self.rng)}],
                "max_tokens": MAX_TOKENS * 4, "n": self.rng.choice([1, 2])}
        self.stream("/v1/chat/completions", body, "disconnect mid-stream",
                    stop_after=self.rng.randint(1, 6))


BAD_REQUESTS: list[tuple[str, str, Any, int]] = [
    ("invalid json", "/v1/chat/completions", b"{not json", 400),
    ("n=0", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 0}, 400),
    ("temperature<0", "/v1/completions", {"prompt": "x", "temperature": -1}, 400),
    ("max_tokens<0", "/v1/completions", {"prompt": "x", "max_tokens": -5}, 400),
    ("top_p=0", "/v1/completions", {"prompt": "x", "top_p": 0}, 400),
    ("no messages", "/v1/chat/completions", {"model": "x"}, 400),
    ("bad role", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400),
    ("unknown model", "/v1/completions", {"prompt": "x", "model": "no-such-model"}, 404),
    ("huge prompt ids", "/v1/completions", {"prompt": [10**9]}, 400),
    ("body is a list", "/v1/completions", [1, 2, 3], 400),
]


class BadRequestUser(_Base):
    weight = 1

    @task
    def bad(self) -> None:
        label, path, body, expected = self.rng.choice(BAD_REQUESTS)
        kwargs: dict[str, Any] = (
            {"data": body, "headers": {"Content-Type": "application/json"}}
            if isinstance(body, bytes) else {"json": body}
        )
        with self.client.post(path, catch_response=True, name=f"bad: {label}", **kwargs) as resp:
            try:
                has_error = "error" in resp.json()
            except ValueError:
                has_error = False
            if resp.status_code == expected and has_error:
                resp.success()
            else:
                resp.failure(f"expected {expected} + error object, got {resp.status_code}: {resp.text[:200]}")
