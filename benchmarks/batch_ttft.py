"""Does a big batch raise interactive time to first token? (Batch API target: by
no more than 20%.)

    .venv/bin/python benchmarks/batch_ttft.py [--users 2] [--requests 20] \
        [--batch-lines 400] [--server-flags "--max-num-seqs 16"]

Starts `sluiceway serve` on the default model (loopback, its own port; stopped by
its process id at the end) and measures the TTFT of streamed chat requests from
`users` clients, each sending `requests` requests one after another with a short
pause between them. In each of `rounds` rounds:

  idle:      nothing else runs;
  batch:     a batch of `batch-lines` chat lines (64 tokens each) runs meanwhile,
             at background priority (then it is cancelled);

and once at the end, `ordinary`: the same lines sent as ordinary requests,
`--batch-concurrency` at a time (what the batch would cost without its priority).

Prints each phase's median and p90 TTFT, the ratio to its round's idle, the
batch lines answered during the phase, and the median ratio over the rounds.
Client and server share the machine's cores: run nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "load_tests"))

from load_server import ServerProcess

MODEL = "SmolLM2-135M-Instruct"
QUESTIONS = [
    "What is the capital of France?",
    "Name three colors of the rainbow.",
    "Write one sentence about the sea.",
    "How many legs does a spider have?",
]


def line_body(i: int) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Tell me fact number {i} about rivers."}],
        "max_tokens": 64,
        "temperature": 0,
        "ignore_eos": True,
    }


async def ttft(client: httpx.AsyncClient, question: str) -> float:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
    }
    started = time.perf_counter()
    first = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if first is None and line.startswith("data: ") and '"content"' in line:
                first = time.perf_counter() - started
    if first is None:
        raise RuntimeError("the stream ended without content")
    return first


async def interactive(url: str, users: int, requests: int, pause: float) -> list[float]:
    times: list[float] = []

    async def user(k: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            for i in range(requests):
                times.append(await ttft(client, QUESTIONS[(k + i) % len(QUESTIONS)]))
                await trio.sleep(pause)

    async with trio.open_nursery() as nursery:
        for k in range(users):
            nursery.start_soon(user, k)
    return times


async def ordinary_load(url: str, lines: int, concurrency: int, done: list[int]) -> None:
    """The batch's lines as ordinary requests, `concurrency` at a time, until
    cancelled or all sent."""
    next_line = iter(range(lines))

    async def worker() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            for i in next_line:
                r = await client.post("/v1/chat/completions", json=line_body(i))
                r.raise_for_status()
                done[0] += 1

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)


async def completed_lines(control: httpx.AsyncClient, batch_id: str) -> int:
    batch = (await control.get(f"/v1/batches/{batch_id}")).json()
    return batch["request_counts"]["completed"]


async def poll_until(condition) -> None:
    """Across the process boundary there is nothing to await: poll, a little apart."""
    while not await condition():  # noqa: ASYNC110
        await trio.sleep(0.05)


def summary(name: str, times: list[float], idle: float | None, lines: int | None) -> str:
    times = sorted(times)
    median = statistics.median(times)
    p90 = times[int(0.9 * (len(times) - 1))]
    ratio = "" if idle is None else f"  x{median / idle:.2f} of idle"
    extra = "" if lines is None else f"  batch lines answered meanwhile: {lines}"
    return f"{name:9s} TTFT median {median * 1000:7.1f} ms  p90 {p90 * 1000:7.1f} ms{ratio}{extra}"


async def upload_batch(control: httpx.AsyncClient, lines: int) -> str:
    content = "".join(
        json.dumps(
            {
                "custom_id": str(i),
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": line_body(i),
            }
        )
        + "\n"
        for i in range(lines)
    )
    upload = (
        await control.post(
            "/v1/files",
            files={"file": ("batch.jsonl", content.encode())},
            data={"purpose": "batch"},
        )
    ).json()
    batch = (
        await control.post(
            "/v1/batches",
            json={
                "input_file_id": upload["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        )
    ).json()
    return batch["id"]


async def stop_batch(control: httpx.AsyncClient, batch_id: str) -> None:
    await control.post(f"/v1/batches/{batch_id}/cancel")

    async def cancelled() -> bool:
        return (await control.get(f"/v1/batches/{batch_id}")).json()["status"] == "cancelled"

    await poll_until(cancelled)


@asynccontextmanager
async def warm_server(
    server_flags: str, batch_concurrency: int, users: int, pause: float
) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    """A `sluiceway serve` on the default model, warmed up by `users` clients:
    its URL and a client for the batch calls; stopped by its process id on exit."""
    flags = [*shlex.split(server_flags), "--batch-concurrency", str(batch_concurrency)]
    log = Path(tempfile.mkdtemp()) / "server.log"
    with ServerProcess.sluiceway(flags, log) as server:
        print(f"server pid {server.pid} at {server.url}, flags: {' '.join(flags)}", flush=True)
        await interactive(server.url, users, 3, pause)
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as control:
            yield server.url, control


async def main(args: argparse.Namespace) -> None:
    async with warm_server(
        args.server_flags, args.batch_concurrency, args.users, args.pause
    ) as (url, control):
        idle_all: list[float] = []
        batch_all: list[float] = []
        ratios = []
        # Rounds of idle then batch, so that a drift in the machine's speed
        # weighs on both.
        for round_ in range(args.rounds):
            idle_times = await interactive(url, args.users, args.requests, args.pause)
            idle = statistics.median(idle_times)
            batch_id = await upload_batch(control, args.batch_lines)

            async def in_full_flow(batch_id: str = batch_id) -> bool:
                return await completed_lines(control, batch_id) >= args.batch_concurrency

            await poll_until(in_full_flow)
            before = await completed_lines(control, batch_id)
            batch_times = await interactive(url, args.users, args.requests, args.pause)
            during = await completed_lines(control, batch_id) - before
            await stop_batch(control, batch_id)
            ratios.append(statistics.median(batch_times) / idle)
            print(f"round {round_ + 1}:", flush=True)
            print(summary("  idle", idle_times, None, None), flush=True)
            print(summary("  batch", batch_times, idle, during), flush=True)
            idle_all += idle_times
            batch_all += batch_times
        print(
            f"median batch/idle ratio over {args.rounds} rounds: x{statistics.median(ratios):.2f}"
        )
        print(summary("all idle", idle_all, None, None))
        print(summary("all batch", batch_all, statistics.median(idle_all), None), flush=True)

        done = [0]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ordinary_load, url, args.batch_lines, args.batch_concurrency, done)

            async def in_flow() -> bool:
                return done[0] >= args.batch_concurrency

            await poll_until(in_flow)
            before = done[0]
            ordinary_times = await interactive(url, args.users, args.requests, args.pause)
            during = done[0] - before
            nursery.cancel_scope.cancel()
        print(summary("ordinary", ordinary_times, statistics.median(idle_all), during), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=2)
    parser.add_argument("--requests", type=int, default=20, help="per user and phase")
    parser.add_argument(
        "--pause", type=float, default=0.2, help="seconds between a user's requests"
    )
    parser.add_argument("--batch-lines", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-concurrency", type=int, default=8)
    parser.add_argument("--server-flags", default="", help="more `sluiceway serve` flags")
    trio.run(main, parser.parse_args())
