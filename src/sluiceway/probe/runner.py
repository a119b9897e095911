"""Runs the chosen scenarios one after another, each within its share of the time
budget and its stated request count, and never leaves a request running."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio

from sluiceway.client import APIError, AsyncClient
from sluiceway.probe.context import ProbeContext, UnsupportedError, leaves
from sluiceway.probe.gauges import Gauges, read_gauges
from sluiceway.probe.ledger import Ledger
from sluiceway.probe.result import ProbeReport, ScenarioResult, Verdict
from sluiceway.probe.scenarios import BY_NAME, SCENARIOS, Scenario

DEFAULT_BUDGET_S = 180.0
SETUP_TIMEOUT_S = 10.0
MIN_SCENARIO_S = 1.0
SETTLE_S = 5.0
SETTLE_POLL_S = 0.1


class ProbeSetupError(Exception):
    """The server could not be reached, or named no model to probe."""


@attrs.frozen
class ProbeConfig:
    """``budget_s`` bounds the whole run; each scenario gets its weight's share of
    it (``bounds()``). ``only`` picks scenarios by name, in the probe's order.
    ``use_metrics=False`` judges by the streams alone, never reading /metrics
    (one shared with other traffic, or behind other access)."""

    url: str
    model: str | None = None
    api_key: str | None = None
    budget_s: float = DEFAULT_BUDGET_S
    only: tuple[str, ...] = ()
    use_metrics: bool = True

    def scenarios(self) -> list[Scenario]:
        unknown = [n for n in self.only if n not in BY_NAME]
        if unknown:
            raise ValueError(f"unknown scenarios {unknown}; known: {', '.join(BY_NAME)}")
        return [s for s in SCENARIOS if not self.only or s.name in self.only]

    def bounds(self) -> dict[str, float]:
        chosen = self.scenarios()
        total = sum(s.weight for s in chosen)
        return {s.name: self.budget_s * s.weight / total for s in chosen}


class ProbeRun:
    """One run of the probe. ``interrupt()`` (Ctrl-C) cancels the scenario in
    progress; every stream it opened is closed before ``run`` returns the report
    of what finished."""

    def __init__(self, config: ProbeConfig) -> None:
        self.config = config
        self._scope = trio.CancelScope()

    def interrupt(self) -> None:
        self._scope.cancel()

    async def run(self, on_result: Callable[[ScenarioResult], None] | None = None) -> ProbeReport:
        """Resolve the model (the first of GET /v1/models unless given), then run
        every chosen scenario. Raises ProbeSetupError when the server cannot be
        asked; a scenario's failure is a verdict, not an exception."""
        config = self.config
        chosen = config.scenarios()
        bounds = config.bounds()
        started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        results: list[ScenarioResult] = []
        model = config.model or ""
        async with AsyncClient(config.url, config.api_key, timeout=None, max_retries=0) as client:
            with self._scope:
                model = config.model or await _first_model(client)
                deadline = trio.current_time() + config.budget_s
                for scenario in chosen:
                    bound = min(bounds[scenario.name], deadline - trio.current_time())
                    if bound < MIN_SCENARIO_S:
                        break
                    result = await run_scenario(scenario, client, config, model, bound, deadline)
                    results.append(result)
                    if on_result is not None:
                        on_result(result)
        done = {r.name for r in results}
        return ProbeReport(
            url=config.url,
            model=model,
            started_at=started,
            budget_s=config.budget_s,
            results=tuple(results),
            not_run=tuple(s.name for s in chosen if s.name not in done),
            interrupted=self._scope.cancelled_caught,
        )


async def _first_model(client: AsyncClient) -> str:
    try:
        with trio.fail_after(SETUP_TIMEOUT_S):
            models = await client.models.list()
    except (APIError, trio.TooSlowError) as exc:
        raise ProbeSetupError(f"GET /v1/models failed: {exc}; give --model") from exc
    if not models.data:
        raise ProbeSetupError("GET /v1/models lists no model; give --model")
    return models.data[0].id


async def run_scenario(
    scenario: Scenario,
    client: AsyncClient,
    config: ProbeConfig,
    model: str,
    bound: float,
    deadline: float,
) -> ScenarioResult:
    """One scenario within ``bound`` seconds. Expiry is a failure whose reason is
    what it was waiting for; a refusal is "not supported"; a broken stream is a
    failure. Everything it opened is closed when this returns, and, where the
    server has running gauges, the server has let it go (or ``SETTLE_S`` passed,
    or the run's ``deadline`` came; ``numbers["server_after"]`` says which)."""
    ledger = Ledger(max_requests=scenario.max_requests)
    ctx = ProbeContext(config.url, model, config.api_key, client, ledger, bound, config.use_metrics)
    before = await ctx.gauges()
    began = trio.current_time()
    verdict, reason = Verdict.FAIL, ""
    with trio.move_on_after(bound) as scope:
        try:
            outcome = await scenario.run(ctx)
        except (Exception, BaseExceptionGroup) as exc:
            verdict, reason = _classify(exc)
        else:
            verdict = Verdict.PASS if outcome.passed else Verdict.FAIL
            reason = outcome.reason
    if scope.cancelled_caught:
        verdict = Verdict.FAIL
        reason = f"not done within its {bound:.1f} s bound: {ctx.describe_progress()}"
        ctx.numbers["streams_at_bound"] = [r.summary(began) for r in ctx.records]
    seconds = trio.current_time() - began
    settle_s = min(SETTLE_S, deadline - trio.current_time())
    if before is not None and settle_s > 0:
        ctx.numbers["server_after"] = await _settle(client, before, settle_s)
    return ScenarioResult(
        name=scenario.name,
        verdict=verdict,
        reason=reason,
        numbers=ctx.numbers,
        load=ledger.load(),
        seconds=seconds,
        bound_s=bound,
    )


async def _settle(client: AsyncClient, before: Gauges, limit_s: float) -> dict[str, Any]:
    """Wait (at most ``limit_s``) for the server's running + waiting count to
    return to what it was before the scenario: every stream the probe closed
    must be let go by the server too. Says how long that took, or what was left."""
    began = trio.current_time()
    now: Gauges | None = before
    with trio.move_on_after(limit_s):
        while True:
            now = await read_gauges(client)
            if now is None or now.busy <= before.busy:
                break
            await trio.sleep(SETTLE_POLL_S)
    busy = None if now is None else now.busy
    return {
        "busy_before": before.busy,
        "busy_after": busy,
        "settled_s": round(trio.current_time() - began, 4),
    }


def _classify(exc: BaseException) -> tuple[Verdict, str]:
    found: Sequence[BaseException] = leaves(exc)
    for leaf in found:
        if isinstance(leaf, UnsupportedError):
            return Verdict.NOT_SUPPORTED, str(leaf)
    for leaf in found:
        if isinstance(leaf, APIError):
            return Verdict.FAIL, f"{type(leaf).__name__}: {leaf}"[:300]
    raise exc
