"""Two running servers, the same load in alternating rounds: which is faster?

    .venv/bin/python benchmarks/server_ab.py --urls http://127.0.0.1:18401,http://127.0.0.1:18402 \
        --concurrency 32 --pairs 16 [--pids 1234,1235] [--output-tokens 128]

Each round sends `concurrency` streamed chat requests of `output-tokens` tokens
(`ignore_eos`, greedy) to one server together and waits for all of them; each pair
of rounds goes to both servers, the first side alternating, so a machine whose
speed drifts (shared hosts do, by 10-30% within seconds) favours neither. Prints
each side's mean tok/s, the median of B's over A's per pair and how many pairs B
won. With `--pids`, also each server's CPU per output token by OS thread (from
/proc), which says where a change moved the work.

Both servers share the machine's cores with each other only while one of them is
idle, and with this client throughout: start them with the same flags but the one
under test, and stop them afterwards (by their process ids).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import trio

from sluiceway.bench.load_http import Connection, Origin, sse_events

_TICKS = os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each of `pid`'s OS threads, by "name/tid"."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # the thread ended
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[f"{name}/{tid}"] = (int(fields[11]) + int(fields[12])) / _TICKS
    return out


def _body(i: int, output_tokens: int) -> bytes:
    return json.dumps(
        {
            "messages": [{"role": "user", "content": f"Tell me a story about river {i}."}],
            "max_tokens": output_tokens,
            "ignore_eos": True,
            "stream": True,
            "temperature": 0.0,
        }
    ).encode()


def _content_chunks(body: bytes) -> int:
    count = 0
    for _, data in sse_events(body):
        if data == "[DONE]":
            continue
        choices = json.loads(data).get("choices")
        if choices and choices[0]["delta"].get("content") is not None:
            count += 1
    return count


async def one_round(conns: list[Connection], first: int, output_tokens: int) -> tuple[int, float]:
    """(content chunks received, seconds) for one request on each connection at once."""
    received = 0

    async def one(conn: Connection, i: int) -> None:
        nonlocal received
        response = await conn.request(
            "POST", "/v1/chat/completions", _body(first + i, output_tokens)
        )
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.body[:200]!r}")
        received += _content_chunks(response.body)

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i, conn in enumerate(conns):
            nursery.start_soon(one, conn, i)
    return received, time.perf_counter() - start


async def compare(args: argparse.Namespace) -> None:
    urls = args.urls.split(",")
    pids = [int(p) for p in args.pids.split(",")] if args.pids else []
    if len(urls) != 2 or (pids and len(pids) != 2):
        raise SystemExit("--urls (and --pids) take two values: A,B")
    conns = [[Connection(Origin.from_url(u)) for _ in range(args.concurrency)] for u in urls]
    for side in conns:  # warm both: first requests compile, allocate and connect
        await one_round(side, 0, args.output_tokens)
    rates: list[list[float]] = [[], []]
    cpu: list[dict[str, float]] = [{}, {}]
    tokens = [0, 0]
    for k in range(args.pairs):
        for side in (0, 1) if k % 2 == 0 else (1, 0):
            before = thread_cpu_seconds(pids[side]) if pids else {}
            got, seconds = await one_round(
                conns[side], (k + 1) * args.concurrency, args.output_tokens
            )
            rates[side].append(got / seconds)
            tokens[side] += got
            if pids:
                for thread, used in thread_cpu_seconds(pids[side]).items():
                    cpu[side][thread] = cpu[side].get(thread, 0.0) + used - before.get(thread, 0.0)
    ratios = [b / a for a, b in zip(*rates, strict=True)]
    print(
        f"concurrency {args.concurrency}, {args.pairs} pairs: A {statistics.mean(rates[0]):.1f} "
        f"tok/s, B {statistics.mean(rates[1]):.1f} tok/s; B/A median x{statistics.median(ratios):.3f}, "
        f"B faster in {sum(r > 1 for r in ratios)} of {len(ratios)}"
    )
    print("per pair B/A: " + " ".join(f"{r:.3f}" for r in ratios))
    for side, name in enumerate("AB"):
        busy = sorted(((used, t) for t, used in cpu[side].items() if used > 0.01), reverse=True)
        for used, thread in busy:
            print(f"  {name} {thread}: {used / max(tokens[side], 1) * 1e6:.0f} us CPU per token")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--urls", required=True, help="A,B: the two servers' base URLs")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--pids", default="", help="A,B: the servers' process ids, for CPU")
    trio.run(compare, parser.parse_args())


if __name__ == "__main__":
    main()
