"""The report side of `sluiceway bench serve`: per-level figures, the markdown table,
JSON and the PNG plot."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from sluiceway.bench.serve_load import LevelRun

PERCENTILES = (50, 90, 99)
_RESAMPLES = 2000  # bootstrap resamples for the paired share's interval


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _percentiles(
    values: Sequence[float], qs: Sequence[int] = PERCENTILES
) -> dict[str, float | None]:
    return {f"p{q}": percentile(values, q) for q in qs}


@attrs.define
class LevelReport:
    """The figures of one concurrency level (times in seconds)."""

    concurrency: int
    requests: int  # requested
    completed: int  # finished without error
    failed: int
    timed_out: bool
    duration_s: float
    output_tokens: int
    prompt_tokens_mean: float | None
    output_tok_s: float
    requests_s: float
    ttft_s: dict[str, float | None]
    itl_s: dict[str, float | None]
    health_s: dict[str, float | None] | None = None
    health_probes: int = 0
    health_failures: int = 0
    engine_tok_s: float | None = None
    # The engine measured right before and right after the level; engine_tok_s is their mean.
    engine_tok_s_bracket: tuple[float, float] | None = None
    # The load generator's own CPU per output token: on a machine it shares with the
    # server, the server loses that much CPU to the measurement.
    client_cpu_us_per_token: float | None = None
    errors: list[str] = attrs.field(factory=list)
    # Rounds of `concurrency` requests sent together, each paired with one engine batch
    # of the same size run right before or after it: (server tok/s, engine tok/s).
    paired_rounds: list[tuple[float, float]] | None = None
    # Constrained outputs: the server's mask fill time and the part steps waited
    # for, in microseconds per masked token.
    grammar_mask_us: tuple[float, float] | None = None

    @property
    def engine_fraction(self) -> float | None:
        if not self.engine_tok_s:
            return None
        return self.output_tok_s / self.engine_tok_s

    @property
    def paired_fraction(self) -> float | None:
        """The server's tok/s over the engine's across the paired rounds, each side's
        total tokens over its total time (every round asks for the same tokens)."""
        rounds = self.paired_rounds
        if not rounds or any(s <= 0 or e <= 0 for s, e in rounds):
            return None
        return _share(rounds)

    @property
    def paired_fraction_interval(self) -> tuple[float, float] | None:
        """A 95% bootstrap interval of `paired_fraction`: the 2.5th and 97.5th
        percentiles of the same share over resamples of the rounds (drawn with
        replacement, seeded, so a report always gives the same interval). The rounds'
        spread comes mostly from the machine's speed drifting between a round's two
        sides; with few rounds the interval is, if anything, too narrow, and it
        covers only this run: slow spells that outlast a pair move every round alike,
        so two sweeps of the same code can give intervals that do not overlap. None
        with fewer than two usable rounds."""
        rounds = self.paired_rounds
        if self.paired_fraction is None or rounds is None or len(rounds) < 2:
            return None
        draw = random.Random(0)
        shares = [_share(draw.choices(rounds, k=len(rounds))) for _ in range(_RESAMPLES)]
        low, high = percentile(shares, 2.5), percentile(shares, 97.5)
        assert low is not None and high is not None
        return low, high

    def to_dict(self) -> dict[str, Any]:
        out = attrs.asdict(self)
        out["engine_fraction"] = self.engine_fraction
        out["paired_fraction"] = self.paired_fraction
        out["paired_fraction_interval"] = self.paired_fraction_interval
        return out


def _share(rounds: Sequence[tuple[float, float]]) -> float:
    """Server over engine across (server tok/s, engine tok/s) rounds that each ask for
    the same tokens: each side's total time per token, engine's over server's."""
    return sum(1 / e for _, e in rounds) / sum(1 / s for s, _ in rounds)


def summarize(run: LevelRun) -> LevelReport:
    ok = [r for r in run.records if r.ok]
    tokens = sum(r.output_tokens for r in ok)
    ttfts = [t for r in ok if (t := r.ttft) is not None]
    itls = [gap for r in ok for gap in r.inter_token_latencies()]
    prompt = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    duration = max(run.duration, 1e-9)
    health = run.health_latencies
    errors = sorted({r.error for r in run.records if r.error})[:5]
    return LevelReport(
        concurrency=run.concurrency,
        requests=run.requested,
        completed=len(ok),
        failed=len(run.records) - len(ok),
        timed_out=run.timed_out,
        duration_s=run.duration,
        output_tokens=tokens,
        prompt_tokens_mean=sum(prompt) / len(prompt) if prompt else None,
        output_tok_s=tokens / duration,
        requests_s=len(ok) / duration,
        ttft_s=_percentiles(ttfts),
        itl_s=_percentiles(itls),
        health_s=None if health is None else _percentiles(health, (50, 99)),
        health_probes=0 if health is None else len(health),
        health_failures=run.health_failures,
        client_cpu_us_per_token=(
            None if run.client_cpu_s is None or not tokens else run.client_cpu_s / tokens * 1e6
        ),
        errors=errors,
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def format_table(reports: Sequence[LevelReport]) -> str:
    """The markdown table: one row per concurrency level."""
    health = any(r.health_s is not None for r in reports)
    engine = any(r.engine_tok_s is not None for r in reports)
    head = [
        "concurrency", "requests", "ok", "output tok/s", "req/s",
        "TTFT p50 ms", "TTFT p90 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p90 ms", "ITL p99 ms",
    ]  # fmt: skip
    if health:
        head += ["/health p50 ms", "/health p99 ms"]
    head += ["client CPU us/tok"]
    masks = any(r.grammar_mask_us is not None for r in reports)
    if masks:
        head += ["mask fill us/tok", "mask wait us/tok"]
    if engine:
        head += ["engine tok/s", "server/engine"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" for _ in head) + "|"]
    for r in reports:
        cells = [
            str(r.concurrency),
            str(r.requests),
            str(r.completed) + (" (time limit)" if r.timed_out else ""),
            f"{r.output_tok_s:.1f}",
            f"{r.requests_s:.2f}",
            *(_ms(r.ttft_s[f"p{q}"]) for q in PERCENTILES),
            *(_ms(r.itl_s[f"p{q}"]) for q in PERCENTILES),
        ]
        if health:
            h = r.health_s or {}
            cells += [_ms(h.get("p50")), _ms(h.get("p99"))]
        cpu = r.client_cpu_us_per_token
        cells.append("-" if cpu is None else f"{cpu:.0f}")
        if masks:
            fill_wait = r.grammar_mask_us
            cells += ["-", "-"] if fill_wait is None else [f"{v:.1f}" for v in fill_wait]
        if engine:
            frac = r.engine_fraction
            cells += [
                "-" if r.engine_tok_s is None else f"{r.engine_tok_s:.1f}",
                "-" if frac is None else f"{frac:.0%}",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_json(path: str | Path, reports: Sequence[LevelReport], config: dict[str, Any]) -> None:
    payload = {"config": config, "levels": [r.to_dict() for r in reports]}
    Path(path).write_text(json.dumps(payload, indent=2) + "\n")


def write_plot(path: str | Path, reports: Sequence[LevelReport], title: str = "") -> None:
    """Throughput and TTFT p99 against concurrency, side by side (Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    xs = [r.concurrency for r in reports]
    fig = Figure(figsize=(10, 4), dpi=100)
    tput, ttft = fig.subplots(1, 2)
    tput.plot(xs, [r.output_tok_s for r in reports], marker="o", label="server")
    engine = [(r.concurrency, r.engine_tok_s) for r in reports if r.engine_tok_s]
    if engine:
        tput.plot(*zip(*engine, strict=True), marker="s", linestyle="--", label="in-process engine")
    tput.set(xlabel="concurrent streams", ylabel="output tokens/s", title="throughput")
    tput.legend()
    p99 = [(r.concurrency, r.ttft_s["p99"]) for r in reports if r.ttft_s["p99"] is not None]
    if p99:
        ttft.plot([x for x, _ in p99], [v * 1000 for _, v in p99], marker="o", color="tab:red")
    ttft.set(xlabel="concurrent streams", ylabel="ms", title="TTFT p99")
    for ax in (tput, ttft):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.grid(True, alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
