"""``sluiceway probe URL``: the command line around ProbeRun."""

from __future__ import annotations

import argparse
import signal
import sys

import trio

from sluiceway.probe.report import header, result_row, summary, table, write_json
from sluiceway.probe.result import ProbeReport
from sluiceway.probe.runner import DEFAULT_BUDGET_S, ProbeConfig, ProbeRun, ProbeSetupError
from sluiceway.probe.scenarios import SCENARIOS

EXIT_FAILED = 1
EXIT_SETUP = 2
EXIT_INTERRUPTED = 130


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def add_probe_parser(sub: argparse._SubParsersAction) -> None:
    names = ", ".join(s.name for s in SCENARIOS)
    p = sub.add_parser(
        "probe",
        help="check an OpenAI-compatible server for stalled, serialised or leaked streams",
        description="Run named scenarios against URL, each bounded in time and requests; "
        "exit 1 if any fails. Scenarios: " + names,
    )
    p.add_argument("url", help="server root or its /v1 base URL")
    p.add_argument(
        "--model", default=None, help="model to ask (default: the first of GET /v1/models)"
    )
    p.add_argument("--api-key", default=None, help="bearer key")
    p.add_argument(
        "--json", default=None, metavar="FILE", help="write every number as JSON ('-': stdout)"
    )
    p.add_argument("--only", default="", metavar="NAMES", help="comma-separated scenarios to run")
    p.add_argument(
        "--budget",
        type=_positive,
        default=DEFAULT_BUDGET_S,
        metavar="SECONDS",
        help=f"seconds for the whole run, shared by weight among the scenarios (default {DEFAULT_BUDGET_S:g})",
    )
    p.add_argument(
        "--no-metrics",
        dest="use_metrics",
        action="store_false",
        help="judge by the streams alone, never reading /metrics (one shared with other traffic)",
    )
    p.set_defaults(handler=run_probe_command)


def run_probe_command(args: argparse.Namespace) -> int:
    """Run the probe; print a row per scenario as it finishes, then the summary.
    Ctrl-C cancels the scenario in progress (closing its streams) and reports what
    finished; exit status 0 all passed, 1 a scenario failed, 2 setup, 130 interrupted."""
    only = tuple(n.strip() for n in args.only.split(",") if n.strip())
    config = ProbeConfig(args.url, args.model, args.api_key, args.budget, only, args.use_metrics)
    try:
        config.scenarios()
    except ValueError as exc:
        print(f"sluiceway probe: {exc}", file=sys.stderr)
        return EXIT_SETUP
    try:
        report = trio.run(_main, config)
    except ProbeSetupError as exc:
        print(f"sluiceway probe: {exc}", file=sys.stderr)
        return EXIT_SETUP
    print(summary(report))
    if args.json:
        write_json(report, args.json)
    if report.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_FAILED if report.failed else 0


async def _main(config: ProbeConfig) -> ProbeReport:
    run = ProbeRun(config)
    bounds = config.bounds()
    print(
        f"sluiceway probe {config.url}: {len(bounds)} scenarios in at most {config.budget_s:g} s",
        flush=True,
    )
    print(header(), flush=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_interrupt_on_sigint, run)
        report = await run.run(lambda r: print(result_row(r), flush=True))
        nursery.cancel_scope.cancel()
    return report


async def _interrupt_on_sigint(run: ProbeRun) -> None:
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        async for _ in signals:
            print("interrupted: closing every open stream", file=sys.stderr, flush=True)
            run.interrupt()


__all__ = ["add_probe_parser", "run_probe_command", "table"]
