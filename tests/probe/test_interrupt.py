"""Interrupting the probe (what Ctrl-C does) leaves nothing running on the server:
every stream of the scenario in progress is closed, and the report says what ran."""

from __future__ import annotations

import trio

from polling import eventually
from server_helpers import engine_empty
from sluiceway.api import RunningServer
from sluiceway.probe import ProbeConfig, ProbeReport, ProbeRun


async def test_interrupt_mid_scenario_leaves_nothing_running(
    sluiceway_server: RunningServer,
) -> None:
    names = ("n_choices", "disconnect_frees_work", "overload")
    run = ProbeRun(ProbeConfig(sluiceway_server.url, only=names, budget_s=120))
    reports: list[ProbeReport] = []
    first_done = trio.Event()

    async def probe() -> None:
        reports.append(await run.run(lambda _: first_done.set()))

    def streaming() -> bool:
        return sluiceway_server.state.engine.stats().num_running_seqs >= 4

    async with trio.open_nursery() as nursery:
        nursery.start_soon(probe)
        await first_done.wait()
        await eventually(streaming)
        run.interrupt()
    (report,) = reports
    assert report.interrupted
    assert [r.name for r in report.results] == ["n_choices"]
    assert report.not_run == ("disconnect_frees_work", "overload")
    await eventually(lambda: engine_empty(sluiceway_server))
