"""Does a batch on an idle server run as fast as the same requests sent
interactively, and what does it do to interactive TTFT? (Batch API targets:
throughput at least 90% of interactive; TTFT p99 during a batch at most 1.5x
idle.)

    .venv/bin/python benchmarks/batch_throughput.py [--lines 1000] [--max-tokens 16] \
        [--prompt-words 0] [--concurrency 8] [--users 2] [--requests 20] [--server-flags "..."]

Starts `sluiceway serve` on the default model (loopback, its own port; stopped by
its process id at the end), then:

  batch:        `lines` chat lines as one Batch API batch (`--batch-concurrency`
                `concurrency`), nothing else running: lines a second;
  interactive:  the same requests as ordinary requests, `concurrency` at a time:
                lines a second;
  TTFT:         `users` clients send streamed chats one after another, on the idle
                server and then while a batch of the same lines runs: p50/p99.

Client and server share the machine's cores: run nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "load_tests"))

from batch_ttft import MODEL, completed_lines, interactive, poll_until, warm_server

PROMPT_WORDS = 0  # --prompt-words: more words of context before each line's question
CONTEXT = "the river flows under a quiet bridge and on past the old mill toward the sea".split()


def line_body(i: int, max_tokens: int, phase: str) -> dict:
    # Each line and each phase opens its message differently, so that no phase
    # finds another's prompts (nor a line another line's) in the prefix cache.
    context = " ".join(CONTEXT[(i + j) % len(CONTEXT)] for j in range(PROMPT_WORDS))
    question = f"{phase} {i}: {context} Tell me fact number {i} about rivers."
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }


async def start_batch(control: httpx.AsyncClient, lines: int, max_tokens: int, phase: str) -> str:
    content = "".join(
        json.dumps(
            {
                "custom_id": str(i),
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": line_body(i, max_tokens, phase),
            }
        )
        + "\n"
        for i in range(lines)
    )
    upload = await control.post(
        "/v1/files", files={"file": ("batch.jsonl", content.encode())}, data={"purpose": "batch"}
    )
    batch = await control.post(
        "/v1/batches",
        json={
            "input_file_id": upload.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
    )
    return batch.json()["id"]


async def batch_seconds(control: httpx.AsyncClient, lines: int, max_tokens: int) -> float:
    started = time.perf_counter()
    batch_id = await start_batch(control, lines, max_tokens, "Batch")

    async def done() -> bool:
        status = (await control.get(f"/v1/batches/{batch_id}")).json()["status"]
        if status in ("failed", "cancelled", "expired"):
            raise RuntimeError(f"the batch ended {status}")
        return status == "completed"

    await poll_until(done)
    return time.perf_counter() - started


async def interactive_seconds(url: str, lines: int, max_tokens: int, concurrency: int) -> float:
    next_line = iter(range(lines))

    async def worker() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            for i in next_line:
                (
                    await client.post(
                        "/v1/chat/completions", json=line_body(i, max_tokens, "Interactive")
                    )
                ).raise_for_status()

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    return time.perf_counter() - started


async def stop_batch(control: httpx.AsyncClient, batch_id: str) -> None:
    """Cancel the batch and wait until it has ended, cancelled or already done."""
    await control.post(f"/v1/batches/{batch_id}/cancel")

    async def ended() -> bool:
        status = (await control.get(f"/v1/batches/{batch_id}")).json()["status"]
        return status in ("cancelled", "completed", "failed")

    await poll_until(ended)


def p99(times: list[float]) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def percentiles(times: list[float]) -> str:
    p50 = sorted(times)[len(times) // 2]
    return f"p50 {p50 * 1000:7.1f} ms  p99 {p99(times) * 1000:7.1f} ms  ({len(times)} requests)"


async def main(args: argparse.Namespace) -> None:
    async with warm_server(args.server_flags, args.concurrency, args.users, args.pause) as (
        url,
        control,
    ):
        batch = await batch_seconds(control, args.lines, args.max_tokens)
        ordinary = await interactive_seconds(url, args.lines, args.max_tokens, args.concurrency)
        print(
            f"{args.lines} lines of {args.max_tokens} tokens, {args.concurrency} at a time: "
            f"batch {args.lines / batch:.2f} lines/s ({batch:.1f} s), interactive "
            f"{args.lines / ordinary:.2f} lines/s ({ordinary:.1f} s): "
            f"batch/interactive {ordinary / batch:.2f}",
            flush=True,
        )
        idle = await interactive(url, args.users, args.requests, args.pause)
        batch_id = await start_batch(control, args.lines, args.max_tokens, "Beside")

        async def in_full_flow() -> bool:
            return await completed_lines(control, batch_id) >= args.concurrency

        await poll_until(in_full_flow)
        during = await interactive(url, args.users, args.requests, args.pause)
        await stop_batch(control, batch_id)
        print(f"TTFT idle:         {percentiles(idle)}")
        print(f"TTFT during batch: {percentiles(during)}")
        print(f"TTFT p99 during batch / idle: x{p99(during) / p99(idle):.2f}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--prompt-words", type=int, default=0, help="words of context before each question"
    )
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--users", type=int, default=2)
    parser.add_argument("--requests", type=int, default=20, help="per user and phase")
    parser.add_argument("--pause", type=float, default=0.2)
    parser.add_argument("--server-flags", default="", help="more `sluiceway serve` flags")
    arguments = parser.parse_args()
    PROMPT_WORDS = arguments.prompt_words
    trio.run(main, arguments)
