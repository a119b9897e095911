"""The table `benchmarks/peers.sh` prints: guidellm's JSON reports of each server at
each level, side by side, and sluiceway's ratios to llama.cpp.

    python benchmarks/peers_table.py RESULTS_DIR

RESULTS_DIR holds `<server>-<streams>.json` (guidellm's `--output kind=json`).
Output tok/s is every request's output tokens (completed, and cut off by the
end of the level) over the level's duration, so a level in which no request
finished still shows what was generated; TTFT and ITL percentiles are over the
completed requests. A missing report, or a percentile with no completed
request, prints as "-".
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

SERVERS = ("llama.cpp", "sluiceway")


def level_figures(path: Path) -> dict[str, float] | None:
    """Output tok/s, completed requests, TTFT and ITL p50/p99 (ms) of one report."""
    try:
        bench = json.loads(path.read_text())["benchmarks"][0]
    except (OSError, ValueError, KeyError, IndexError):
        return None
    metrics = bench["metrics"]
    done = metrics["request_totals"]["successful"]
    tok_s = metrics["output_token_count"]["total"]["total_sum"] / bench["duration"]
    if not done:
        return {"tok_s": tok_s, "requests": 0}

    def pct(name: str, p: str) -> float:
        return float(metrics[name]["successful"]["percentiles"][p])

    return {
        "tok_s": tok_s,
        "requests": done,
        "ttft_p50": pct("time_to_first_token_ms", "p50"),
        "ttft_p99": pct("time_to_first_token_ms", "p99"),
        "itl_p50": pct("inter_token_latency_ms", "p50"),
        "itl_p99": pct("inter_token_latency_ms", "p99"),
    }


def _cell(figures: dict[str, float] | None, key: str, fmt: str) -> str:
    if figures is None or key not in figures:
        return "-"
    return format(figures[key], fmt)


def main(directory: str) -> None:
    root = Path(directory)
    levels = sorted(
        {int(m.group(1)) for p in root.glob("*.json") if (m := re.search(r"-(\d+)\.json$", p.name))}
    )
    print(
        "| streams | server | output tok/s | completed requests | TTFT p50 ms | TTFT p99 ms "
        "| ITL p50 ms | ITL p99 ms |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    figures = {(s, n): level_figures(root / f"{s}-{n}.json") for n in levels for s in SERVERS}
    for n in levels:
        for s in SERVERS:
            f = figures[s, n]
            print(
                f"| {n} | {s} | {_cell(f, 'tok_s', '.1f')} | {_cell(f, 'requests', 'd')} "
                f"| {_cell(f, 'ttft_p50', '.0f')} | {_cell(f, 'ttft_p99', '.0f')} "
                f"| {_cell(f, 'itl_p50', '.1f')} | {_cell(f, 'itl_p99', '.1f')} |"
            )
    print()
    for n in levels:
        ours, theirs = figures["sluiceway", n], figures["llama.cpp", n]
        if ours and theirs and theirs["tok_s"]:
            print(
                f"{n} streams: sluiceway / llama.cpp output tok/s = {ours['tok_s'] / theirs['tok_s']:.2f}x"
            )
        else:
            print(f"{n} streams: no ratio (a server completed no request)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: peers_table.py RESULTS_DIR")
    main(sys.argv[1])
