"""The load side of `sluiceway bench serve`: prompts, one timed streamed request, a
closed-loop concurrency level, and a /health prober.

Talks plain OpenAI-compatible HTTP (the streamed requests through `load_http`, the
rest through httpx, on trio), so it measures any server: sluiceway, llama.cpp's
server, vLLM.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import httpx
import trio

from sluiceway.bench.load_http import Connection, LoadHTTPError, Origin, sse_events

# A fixed, varied set of chat prompts (short questions, instructions, longer asks).
BUILTIN_PROMPTS: tuple[str, ...] = (
    "Explain the basic principle of quantum computing.",
    "Write a hello world program in Python.",
    "What is the capital of France?",
    "Summarize the plot of Romeo and Juliet in three sentences.",
    "Give me five ideas for a rainy Sunday afternoon.",
    "How does a bicycle stay upright when it is moving?",
    "Translate 'Where is the train station?' into Spanish and German.",
    "Write a short poem about a river at night.",
    "What are the main differences between TCP and UDP?",
    "Describe how to make a cup of green tea, step by step.",
    "Why is the sky blue? Answer for a ten-year-old.",
    "List the planets of the solar system in order from the sun.",
    "Write a polite email asking a colleague to review a document by Friday.",
    "What is a prime number? Give three examples and one counterexample.",
    "Explain recursion with a simple example in any programming language.",
    "Tell me a short story about a lighthouse keeper and a lost cat.",
)

_WORDS = (
    "river stone bridge quiet morning lantern garden window harbor signal paper "
    "market winter orchard silver engine meadow thunder letter valley copper "
    "candle forest station mirror island rhythm shadow ladder compass velvet"
).split()


def random_prompts(count: int, words: int, range_ratio: float, seed: int) -> list[str]:
    """`count` prompts of random words, each `words * (1 ± range_ratio)` words long."""
    rng = random.Random(seed)
    low = max(1, round(words * (1 - range_ratio)))
    high = max(low, round(words * (1 + range_ratio)))
    return [
        " ".join(rng.choice(_WORDS) for _ in range(rng.randint(low, high))) for _ in range(count)
    ]


HEALTH_TIMEOUT = 10.0


# `--response-format json_schema`: an array of at least 50 records, so every
# constrained output runs to max_tokens as an unconstrained one with ignore_eos does,
# and a sweep with it compares with a sweep without it token for token.
BENCH_SCHEMA: dict[str, Any] = {
    "type": "array",
    "minItems": 50,
    "items": {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 0},
            "name": {"type": "string", "maxLength": 16},
            "score": {"type": "number", "minimum": 0, "maximum": 100},
            "tags": {"type": "array", "items": {"enum": ["new", "hot", "old"]}, "maxItems": 3},
        },
        "required": ["id", "name", "score", "tags"],
        "additionalProperties": False,
    },
}


def response_format(kind: str) -> dict[str, Any] | None:
    """The `response_format` of `--response-format kind` (None for text)."""
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": "records", "schema": BENCH_SCHEMA}}
    return None


@attrs.frozen
class LoadSpec:
    """What each request asks for."""

    model: str
    api: str = "chat"  # "chat" or "completions"
    output_tokens: int = 128
    ignore_eos: bool = True
    temperature: float = 0.0
    request_timeout: float = 600.0
    response_format: dict[str, Any] | None = None

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.api == "chat" else "/v1/completions"

    def body(self, prompt: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.output_tokens,
            "temperature": self.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.response_format is not None:
            body["response_format"] = self.response_format
        return body


@attrs.define
class RequestRecord:
    """One request's timings (seconds, perf_counter) and counts."""

    start: float
    end: float = 0.0
    first_token: float | None = None
    chunk_times: list[float] = attrs.field(factory=list)  # arrival of each content chunk
    usage_tokens: int | None = None  # completion_tokens from the usage chunk
    prompt_tokens: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def output_tokens(self) -> int:
        """From usage where the server sent it, else the number of content chunks."""
        return self.usage_tokens if self.usage_tokens is not None else len(self.chunk_times)

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    def inter_token_latencies(self) -> list[float]:
        t = self.chunk_times
        return [b - a for a, b in itertools.pairwise(t)]


def _chunk_text(chunk: dict[str, Any]) -> str:
    parts = []
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta")
        text = (delta or {}).get("content") if delta is not None else choice.get("text")
        if text:
            parts.append(text)
    return "".join(parts)


def _take_chunk(record: RequestRecord, data: str, now: float) -> None:
    chunk = json.loads(data)
    if "error" in chunk:
        error = chunk["error"]
        record.error = str(error.get("message", error) if isinstance(error, dict) else error)
        return
    if _chunk_text(chunk):
        if record.first_token is None:
            record.first_token = now
        record.chunk_times.append(now)
    usage = chunk.get("usage")
    if usage:
        record.usage_tokens = usage.get("completion_tokens")
        record.prompt_tokens = usage.get("prompt_tokens")


async def timed_request(connection: Connection, spec: LoadSpec, prompt: str) -> RequestRecord:
    """Send one streamed request and time its chunks. Never raises for a failed request
    (the record carries the error); cancellation propagates. Each chunk's time is when
    the read that completed its event returned (see `load_http`)."""
    record = RequestRecord(start=time.perf_counter())
    done = False
    body = json.dumps(spec.body(prompt)).encode()
    try:
        with trio.fail_after(spec.request_timeout):
            response = await connection.request("POST", spec.path, body)
        record.start = response.started
        if response.status_code != 200:
            text = response.body.decode(errors="replace")
            record.error = f"HTTP {response.status_code}: {text[:200]}"
        else:
            for end, data in sse_events(response.body):
                if data == "[DONE]":
                    done = True
                elif not done and data:
                    _take_chunk(record, data, response.arrival(end))
            if record.error is None and not done:
                record.error = "the stream ended without [DONE]"
        record.end = response.finished
    except trio.TooSlowError:
        record.error = f"timed out after {spec.request_timeout} s"
    except (LoadHTTPError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    if not record.end:  # no whole response: it ended when the request gave up
        record.end = time.perf_counter()
    return record


@attrs.define
class LevelRun:
    """What one concurrency level produced."""

    concurrency: int
    requested: int
    records: list[RequestRecord]
    duration: float
    health_latencies: list[float] | None = None
    health_failures: int = 0
    timed_out: bool = False
    client_cpu_s: float | None = None  # this process's CPU time over the level


async def run_level(
    origin: Origin,
    spec: LoadSpec,
    prompts: Sequence[str],
    *,
    concurrency: int,
    num_requests: int,
    max_duration: float,
    on_done: Callable[[RequestRecord], None] = lambda r: None,
    probe_health: bool = False,
    health_interval: float = 0.05,
) -> LevelRun:
    """Closed loop: `concurrency` workers send `num_requests` requests in all, prompts
    taken in turn. Stops after `max_duration` seconds (unfinished requests are dropped
    and the level is marked `timed_out`)."""
    records: list[RequestRecord] = []
    next_index = 0
    health: list[float] = []
    failures = [0]

    async def worker() -> None:
        nonlocal next_index
        connection = Connection(origin)  # kept alive across this worker's requests
        try:
            while next_index < num_requests:
                i = next_index
                next_index += 1
                record = await timed_request(connection, spec, prompts[i % len(prompts)])
                records.append(record)
                on_done(record)
        finally:
            await connection.aclose()

    start, cpu_start = time.perf_counter(), time.process_time()
    with trio.move_on_after(max_duration) as scope:
        async with trio.open_nursery() as nursery:
            if probe_health:
                probe_scope = trio.CancelScope()
                nursery.start_soon(
                    _probe_health, origin, health_interval, health, failures, probe_scope
                )
            async with trio.open_nursery() as workers:
                for _ in range(min(concurrency, num_requests)):
                    workers.start_soon(worker)
            if probe_health:
                probe_scope.cancel()
    duration = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    return LevelRun(
        concurrency=concurrency,
        requested=num_requests,
        records=records,
        duration=duration,
        health_latencies=health if probe_health else None,
        health_failures=failures[0],
        timed_out=scope.cancelled_caught,
        client_cpu_s=cpu,
    )


async def _probe_health(
    origin: Origin,
    interval: float,
    out: list[float],
    failures: list[int],
    scope: trio.CancelScope,
) -> None:
    """GET /health every `interval` seconds (on its own connection) until cancelled;
    a probe that takes more than `HEALTH_TIMEOUT` seconds counts as failed."""
    connection = Connection(origin)
    try:
        with scope:
            next_at = trio.current_time()
            while True:
                t0 = time.perf_counter()
                ok = False
                with trio.move_on_after(HEALTH_TIMEOUT):
                    try:
                        ok = (await connection.request("GET", "/health")).status_code == 200
                    except LoadHTTPError:
                        pass
                if ok:
                    out.append(time.perf_counter() - t0)
                else:
                    failures[0] += 1
                next_at = max(next_at + interval, trio.current_time())
                await trio.sleep_until(next_at)
    finally:
        await connection.aclose()


_MASK_COUNTERS = (
    "sluiceway_grammar_mask_rows_total",
    "sluiceway_grammar_mask_fill_seconds_total",
    "sluiceway_grammar_mask_wait_seconds_total",
)


async def mask_counters(client: httpx.AsyncClient) -> dict[str, float] | None:
    """The server's grammar-mask counters from /metrics; None where it has none."""
    try:
        response = await client.get("/metrics", timeout=HEALTH_TIMEOUT)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    found: dict[str, float] = {}
    for line in response.text.splitlines():
        name, _, value = line.partition(" ")
        if name in _MASK_COUNTERS:
            found[name] = float(value)
    return found if len(found) == len(_MASK_COUNTERS) else None


def mask_us_per_token(
    before: dict[str, float] | None, after: dict[str, float] | None
) -> tuple[float, float] | None:
    """(fill, wait) microseconds per masked token between two `mask_counters`
    readings; None without masked tokens."""
    if before is None or after is None:
        return None
    rows = after[_MASK_COUNTERS[0]] - before[_MASK_COUNTERS[0]]
    if rows <= 0:
        return None
    fill = after[_MASK_COUNTERS[1]] - before[_MASK_COUNTERS[1]]
    wait = after[_MASK_COUNTERS[2]] - before[_MASK_COUNTERS[2]]
    return fill / rows * 1e6, wait / rows * 1e6


async def first_model(client: httpx.AsyncClient) -> str:
    """The first model id the server lists."""
    response = await client.get("/v1/models")
    response.raise_for_status()
    data = response.json().get("data") or []
    if not data:
        raise RuntimeError("the server lists no models; pass --model")
    return str(data[0]["id"])


def root_url(url: str) -> str:
    """The server root, for a root URL or an OpenAI base URL ending in /v1."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def default_requests(concurrency: int) -> int:
    return max(8, 2 * concurrency)
