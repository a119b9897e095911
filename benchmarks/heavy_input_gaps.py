"""How long another client's stream pauses while heavy request bodies arrive.

    .venv/bin/python benchmarks/heavy_input_gaps.py --url http://127.0.0.1:8000 \
        [--heavy 4] [--kind messages|text|tokenize] [--model NAME]

Streams one chat completion (`ignore_eos`, up to `--max-tokens` tokens), and once
`--warmup` tokens have arrived sends `--heavy` requests at once, each about 3.6 MB:
`messages` is a chat of 110,000 empty messages, `text` a chat of one 3.5 MB
message, `tokenize` the 110,000 messages to `/tokenize`. Prints the largest and
typical gaps between the stream's events before the heavy requests and while they
are handled, and each heavy request's status and time. The stream ends once every
heavy request has been answered.

Any server: a fake one (`load_tests/fake_server.py --step-delay 0.01`, which
sleeps instead of computing) shows what the event loop does; the default model
adds the competition for the cores. The client reads with blocking sockets on
threads, so its own scheduling adds nothing measurable to the gaps.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import statistics
import threading
import time
from urllib.parse import urlsplit

HEADERS = {"Content-Type": "application/json"}


def heavy_body(kind: str, model: str) -> tuple[str, bytes]:
    if kind == "text":
        messages = [{"role": "user", "content": "the river " * 350_000}]
    else:
        messages = [{"role": "user", "content": ""}] * 110_000
    path = "/tokenize" if kind == "tokenize" else "/v1/chat/completions"
    body: dict[str, object] = {"model": model, "messages": messages}
    if kind != "tokenize":
        body["max_tokens"] = 1
    return path, json.dumps(body).encode()


def read_stream(
    host: str, port: int, body: bytes, stop: threading.Event, times: list[float]
) -> None:
    """Note the arrival time of every event of one streamed response until `stop`."""
    conn = http.client.HTTPConnection(host, port, timeout=600)
    conn.request("POST", "/v1/chat/completions", body=body, headers=HEADERS)
    response = conn.getresponse()
    assert response.status == 200, response.read()[:300]
    while not stop.is_set():
        data = response.read1(65536)
        if not data:
            break
        now = time.perf_counter()
        times.extend([now] * data.count(b"data: "))
    conn.close()


def post(host: str, port: int, path: str, data: bytes, out: list[object], i: int) -> None:
    start = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=600)
    conn.request("POST", path, body=data, headers=HEADERS)
    response = conn.getresponse()
    payload = response.read()
    out[i] = (response.status, time.perf_counter() - start, payload[:160])
    conn.close()


def gaps_ms(times: list[float]) -> list[float]:
    return [(b - a) * 1e3 for a, b in itertools.pairwise(times)]


def summary(label: str, gaps: list[float]) -> str:
    if not gaps:
        return f"{label}: no events"
    gaps = sorted(gaps)
    p50 = statistics.median(gaps)
    p99 = gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))]
    return f"{label}: {len(gaps)} gaps, p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {gaps[-1]:.1f} ms"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="model name (default: the server's first)")
    p.add_argument("--heavy", type=int, default=4)
    p.add_argument("--kind", choices=["messages", "text", "tokenize"], default="messages")
    p.add_argument("--max-tokens", type=int, default=1900)
    p.add_argument("--warmup", type=int, default=30, help="stream events before the heavy requests")
    args = p.parse_args()
    parts = urlsplit(args.url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    model = args.model
    if model is None:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        conn.request("GET", "/v1/models")
        model = json.loads(conn.getresponse().read())["data"][0]["id"]
        conn.close()
    path, data = heavy_body(args.kind, model)
    chat = {
        "model": model,
        "messages": [{"role": "user", "content": "Count slowly."}],
        "max_tokens": args.max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    stop = threading.Event()
    times: list[float] = []
    reader = threading.Thread(
        target=read_stream, args=(host, port, json.dumps(chat).encode(), stop, times)
    )
    reader.start()
    while len(times) < args.warmup:
        time.sleep(0.001)
    results: list[object] = [None] * args.heavy
    senders = [
        threading.Thread(target=post, args=(host, port, path, data, results, i))
        for i in range(args.heavy)
    ]
    heavy_start = time.perf_counter()
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    heavy_end = time.perf_counter()
    count = len(times)
    while len(times) == count and reader.is_alive():  # the first event after them
        time.sleep(0.001)
    stop.set()
    reader.join()
    before = [t for t in times if t < heavy_start]
    during = [t for t in times if heavy_start <= t <= heavy_end]
    after = [t for t in times if t > heavy_end]
    # The gaps that span the start and the end of the heavy requests count as theirs.
    spanning = before[-1:] + during + after[:1]
    print(f"{args.heavy} x {args.kind} ({len(data) / 1e6:.1f} MB each) to {path}")
    print(summary("stream before", gaps_ms(before[1:])))
    print(summary("stream during", gaps_ms(spanning)))
    print(f"heavy requests handled in {heavy_end - heavy_start:.2f} s:")
    for status, seconds, head in results:  # type: ignore[misc]
        print(f"  {status} in {seconds:.2f} s: {head!r}")
    if not after:
        print("(the stream ended before the heavy requests did; raise --max-tokens)")


if __name__ == "__main__":
    main()
