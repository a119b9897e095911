"""Each scenario fails against a loopback server with the failure it looks for,
and passes against the same server without it (so the failure is what made it
fail). Pure trio on the autojump clock: a scenario's bound costs no real time."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio
import trio.testing
from broken_server import BrokenServer, Flaws

from sluiceway.probe import ProbeConfig, ProbeRun, ScenarioResult, Verdict

BUDGET_S = 60.0


async def probe(
    nursery: trio.Nursery, name: str, flaws: Flaws, use_metrics: bool = True, **server: Any
) -> ScenarioResult:
    broken: BrokenServer = await nursery.start(BrokenServer(flaws, **server).serve)
    config = ProbeConfig(broken.url, only=(name,), budget_s=BUDGET_S, use_metrics=use_metrics)
    report = await ProbeRun(config).run()
    assert report.model == "broken"
    (result,) = report.results
    return result


FAILURES = [
    ("parallel_streams", Flaws(serialise=True), {}, "serialised"),
    ("batch_prompts", Flaws(serialise=True), {}, "serialised"),
    ("batch_chat", Flaws(serialise=True), {}, "serialised"),
    ("n_choices", Flaws(index_zero=True), {}, "no entries for indices [1, 2, 3]"),
    ("n_choices", Flaws(serialise=True), {}, "serialised"),
    ("early_stop", Flaws(stall_after_stop=True), {}, "never finished"),
    ("stalled_reader", Flaws(lockstep_writes=True), {}, "streams did not finish"),
    ("disconnect_frees_work", Flaws(ignore_disconnect=True), {}, "the work runs on"),
    (
        "disconnect_frees_work",
        Flaws(ignore_disconnect=True),
        {"metrics": False},
        "without /metrics",
    ),
    (
        "disconnect_frees_work",
        Flaws(ignore_disconnect=True),
        {"use_metrics": False},
        "without /metrics",
    ),
    ("client_cancel", Flaws(leak_slot_on_disconnect=True), {"slots": 2}, "got no output"),
    ("reconnect_storm", Flaws(leak_slot_on_disconnect=True), {"slots": 2}, "opened and dropped"),
    ("overload", Flaws(ignore_disconnect=True), {"slots": 1}, "unbounded queueing"),
    (
        "overload",
        Flaws(refuse_without_retry_after=True),
        {"slots": 2, "max_waiting": 2},
        "refusals without Retry-After",
    ),
    ("usage_finish", Flaws(usage_first_choice_only=True), {}, "completion_tokens"),
    ("tool_call_deltas", Flaws(tool_call_without_id=True), {}, "lacks id, type or name"),
    ("tool_call_deltas", Flaws(split_entries=True), {}, "carried one index twice"),
    ("structured_output_deltas", Flaws(split_entries=True), {}, "carried one index twice"),
]


@pytest.mark.parametrize(
    ("name", "flaws", "server", "why"),
    FAILURES,
    ids=[f"{c[0]}-{'+'.join(k for k, v in attrs.asdict(c[1]).items() if v)}" for c in FAILURES],
)
async def test_scenario_fails_against_its_broken_server(
    nursery: trio.Nursery,
    autojump_clock: trio.testing.MockClock,
    name: str,
    flaws: Flaws,
    server: dict[str, Any],
    why: str,
) -> None:
    result = await probe(nursery, name, flaws, **server)
    assert result.verdict is Verdict.FAIL, result
    assert why in result.reason, result.reason


PASSES = [
    *((name, {}) for name in sorted({c[0] for c in FAILURES})),
    ("disconnect_frees_work", {"metrics": False}),  # judged by the kept stream's rate
    ("disconnect_frees_work", {"use_metrics": False}),  # the same, by choice
    ("overload", {"slots": 2, "max_waiting": 2}),  # refused, with Retry-After
    ("reconnect_storm", {"slots": 2, "max_waiting": 2}),  # some refused: an answer
]


@pytest.mark.parametrize(("name", "server"), PASSES)
async def test_scenario_passes_against_the_same_server_without_the_flaw(
    nursery: trio.Nursery,
    autojump_clock: trio.testing.MockClock,
    name: str,
    server: dict[str, Any],
) -> None:
    result = await probe(nursery, name, Flaws(), **server)
    assert result.verdict is Verdict.PASS, result


async def test_refused_tools_are_not_supported_rather_than_failed(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    result = await probe(nursery, "tool_call_deltas", Flaws(refuse_tools=True))
    assert result.verdict is Verdict.NOT_SUPPORTED, result
    assert "HTTP 400" in result.reason
