"""The table `benchmarks/peers.sh` prints: guidellm's JSON reports of each server at
each level, side by side, and sluiceway's ratios to llama.cpp.

    python benchmarks/peers_table.py RESULTS_DIR
    python benchmarks/peers_table.py --bound MODEL.gguf > RESULTS_DIR/bound.json

With `RESULTS_DIR/bound-<server>.json` (written by the second form just before
that server's one-stream level; `bound.json` serves both where those are
missing) it also prints one stream's decode (1000 / ITL p50) against the memory
bandwidth bound: a decode step of one sequence reads every weight once, so it
runs at most at (bandwidth) / (bytes read per step). The bytes are the GGUF's
tensors but the token embedding (only looked up), or with it where the output
head is tied to it (a server that holds some in fewer bytes, as sluiceway's
per-row int8 holds Q8_0, reads a little less); the bandwidth is the best of ten
torch sums over 2 GiB on every core, more than any cache holds (over 256 MB
this machine's caches doubled the figure).

After the table, a plot of output tok/s, a bar per server and level in text (a
fenced block that renders in docs/benchmarks.md as it prints).

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


def step_bytes(path: str) -> int:
    """Bytes one decode step of one sequence reads: every tensor of the GGUF but the
    token embedding, unless the output head is tied to it."""
    import gguf

    tensors = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(path).tensors}
    embedding = tensors.pop("token_embd.weight", 0)
    return sum(tensors.values()) + (0 if "output.weight" in tensors else embedding)


def bandwidth() -> float:
    """Bytes a second a torch sum over 2 GiB reads on every core (best of ten)."""
    import time

    import torch

    data = torch.ones(1 << 29, dtype=torch.float32)
    data.sum()
    best = float("inf")
    for _ in range(10):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.numel() * 4 / best


def bound_line(bound: dict[str, float], figures: dict[str, float] | None, server: str) -> str:
    """One stream's decode rate as a share of the bandwidth bound."""
    limit = bound["bandwidth"] / bound["step_bytes"]
    if figures is None or "itl_p50" not in figures or not figures["itl_p50"]:
        return f"{server}: no one-stream decode rate (bound {limit:.1f} tok/s)"
    rate = 1000 / figures["itl_p50"]
    return (
        f"{server}: one stream decodes {rate:.1f} tok/s (1000 / ITL p50) = {100 * rate / limit:.0f}% "
        f"of the bound {limit:.1f} tok/s ({bound['step_bytes'] / 1e6:.0f} MB a step at "
        f"{bound['bandwidth'] / 1e9:.1f} GB/s)"
    )


BAR_WIDTH = 48


def bars(figures: dict[tuple[str, int], dict[str, float] | None], levels: list[int]) -> list[str]:
    """Output tok/s of each server at each level as text bars, all to one scale
    (the longest is BAR_WIDTH characters; a level with no report says so)."""
    rates = [f["tok_s"] for f in figures.values() if f is not None]
    top = max(rates, default=0.0) or 1.0
    lines = ["```", f"output tok/s (the longest bar: {top:.1f})"]
    for n in levels:
        for s in SERVERS:
            f = figures[s, n]
            label = f"{n:>3} streams {s:<9}"
            if f is None:
                lines.append(f"{label} (no report)")
                continue
            eighths = round(8 * BAR_WIDTH * f["tok_s"] / top)
            bar = (
                "\u2588" * (eighths // 8)
                + ("", "\u258f", "\u258e", "\u258d", "\u258c", "\u258b", "\u258a", "\u2589")[
                    eighths % 8
                ]
            )
            lines.append(f"{label} {bar} {f['tok_s']:.1f}")
    lines.append("```")
    return lines


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
    print("\n".join(bars(figures, levels)))
    print()
    for n in levels:
        ours, theirs = figures["sluiceway", n], figures["llama.cpp", n]
        if ours and theirs and theirs["tok_s"]:
            print(
                f"{n} streams: sluiceway / llama.cpp output tok/s = {ours['tok_s'] / theirs['tok_s']:.2f}x"
            )
        else:
            print(f"{n} streams: no ratio (a server completed no request)")
    if 1 in levels:
        lines = []
        for s in SERVERS:
            for name in (f"bound-{s}.json", "bound.json"):
                if (root / name).is_file():
                    lines.append(
                        bound_line(json.loads((root / name).read_text()), figures[s, 1], s)
                    )
                    break
        if lines:
            print()
            print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--bound":
        print(json.dumps({"step_bytes": step_bytes(sys.argv[2]), "bandwidth": bandwidth()}))
    elif len(sys.argv) == 2:
        main(sys.argv[1])
    else:
        sys.exit("usage: peers_table.py RESULTS_DIR | --bound MODEL.gguf")
