"""sluiceway.probe: check any OpenAI-compatible server for the failures sluiceway
exists to prevent (streams serialised or stalled, disconnects that leave work
running, unbounded queues, malformed per-choice deltas). See ``docs/probe.md``.

    from sluiceway.probe import ProbeConfig, ProbeRun
    report = await ProbeRun(ProbeConfig("http://127.0.0.1:8000")).run()

Built on ``sluiceway.client``: it needs no model, torch or server code.
"""

from sluiceway.probe.result import Load, ProbeReport, ScenarioResult, Verdict
from sluiceway.probe.runner import DEFAULT_BUDGET_S, ProbeConfig, ProbeRun, ProbeSetupError
from sluiceway.probe.scenarios import SCENARIOS, Scenario

__all__ = [
    "DEFAULT_BUDGET_S",
    "SCENARIOS",
    "Load",
    "ProbeConfig",
    "ProbeReport",
    "ProbeRun",
    "ProbeSetupError",
    "Scenario",
    "ScenarioResult",
    "Verdict",
]
