"""The probe's report as a terminal table and as JSON."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from sluiceway.probe.result import ProbeReport, ScenarioResult

NAME_WIDTH = 26
VERDICT_WIDTH = 14
LOAD_WIDTH = 14
REASON_WIDTH = 72


def result_row(result: ScenarioResult) -> str:
    """One scenario as table lines: name, verdict, load (requests / most at once),
    seconds, and the reason wrapped under its column."""
    load = f"{result.load.requests} req/{result.load.peak_concurrency} max"
    head = (
        f"{result.name:<{NAME_WIDTH}} {result.verdict.value:<{VERDICT_WIDTH}} "
        f"{load:<{LOAD_WIDTH}} {result.seconds:>6.1f}s  "
    )
    lines = textwrap.wrap(result.reason, REASON_WIDTH) or [""]
    pad = " " * len(head)
    return "\n".join([head + lines[0], *(pad + line for line in lines[1:])])


def header() -> str:
    head = (
        f"{'scenario':<{NAME_WIDTH}} {'verdict':<{VERDICT_WIDTH}} {'load':<{LOAD_WIDTH}} "
        f"{'time':>7}  reason"
    )
    return head + "\n" + "-" * (len(head) + REASON_WIDTH - 6)


def table(report: ProbeReport) -> str:
    """The whole report: where and what was probed, a row per scenario, a summary."""
    lines = [
        f"sluiceway probe {report.url} model={report.model} budget={report.budget_s:g}s "
        f"started={report.started_at}",
        header(),
        *(result_row(r) for r in report.results),
        summary(report),
    ]
    return "\n".join(lines)


def summary(report: ProbeReport) -> str:
    counts: dict[str, int] = {}
    for r in report.results:
        counts[r.verdict.value] = counts.get(r.verdict.value, 0) + 1
    sent = sum(r.load.requests for r in report.results)
    parts = [f"{n} {v}" for v, n in counts.items()]
    text = f"{', '.join(parts) or 'nothing ran'}; {sent} requests sent in all"
    if report.not_run:
        why = "interrupted" if report.interrupted else "budget spent"
        text += f"; not run ({why}): {', '.join(report.not_run)}"
    return text


def write_json(report: ProbeReport, path: str) -> None:
    """Every number, to ``path`` (``-`` for standard output)."""
    text = json.dumps(report.as_dict(), indent=2, default=str)
    if path == "-":
        print(text)
    else:
        Path(path).write_text(text + "\n")
