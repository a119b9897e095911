"""Every scenario passes against sluiceway itself (a real server over a scripted
runner, on a loopback port in the test's nursery)."""

from __future__ import annotations

from sluiceway.api import RunningServer
from sluiceway.probe import ProbeConfig, ProbeRun, Verdict
from sluiceway.probe.report import table


async def test_every_scenario_passes_against_sluiceway(sluiceway_server: RunningServer) -> None:
    report = await ProbeRun(ProbeConfig(sluiceway_server.url, budget_s=240)).run()
    print(table(report))
    verdicts = {r.name: (r.verdict, r.reason) for r in report.results}
    failed = {k: v for k, v in verdicts.items() if v[0] is not Verdict.PASS}
    assert not failed, failed
    assert report.model == "test-model"
    assert not report.not_run
    # After each scenario the server let go of everything the probe had sent.
    left = {
        r.name: r.numbers["server_after"]
        for r in report.results
        if r.numbers["server_after"]["busy_after"] > r.numbers["server_after"]["busy_before"]
    }
    assert not left, left
