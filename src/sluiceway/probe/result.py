"""What a probe found: a verdict per scenario, the numbers behind it, what was sent."""

from __future__ import annotations

import enum
from typing import Any

import attrs


class Verdict(enum.Enum):
    """``pass``: the server behaved; ``fail``: it showed the failure the scenario
    looks for (or hung past the scenario's bound); ``not supported``: the server
    refused the feature the scenario needs (a 4xx), so nothing was judged."""

    PASS = "pass"
    FAIL = "fail"
    NOT_SUPPORTED = "not supported"


@attrs.frozen
class Load:
    """What one scenario sent: requests, the most in flight at once, the largest
    ``max_tokens`` any of them asked for, and how many of each kind (endpoint and
    shape, see ``ledger.describe``): what a server's operator needs to know."""

    requests: int = 0
    peak_concurrency: int = 0
    max_tokens: int = 0
    kinds: dict[str, int] = attrs.field(factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class ScenarioResult:
    """One scenario's verdict, its one-line reason, every number it measured, the
    load it put on the server and how long it ran (seconds, the probe's clock)."""

    name: str
    verdict: Verdict
    reason: str
    numbers: dict[str, Any]
    load: Load
    seconds: float
    bound_s: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict.value,
            "reason": self.reason,
            "numbers": self.numbers,
            "load": self.load.as_dict(),
            "seconds": round(self.seconds, 3),
            "bound_s": round(self.bound_s, 3),
        }


@attrs.frozen
class ProbeReport:
    """Every scenario that ran, in order; ``not_run`` lists those an interrupt
    (Ctrl-C) or the spent total budget left out."""

    url: str
    model: str
    started_at: str
    budget_s: float
    results: tuple[ScenarioResult, ...]
    not_run: tuple[str, ...] = ()
    interrupted: bool = False

    @property
    def failed(self) -> bool:
        return any(r.verdict is Verdict.FAIL for r in self.results)

    def as_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "model": self.model,
            "started_at": self.started_at,
            "budget_s": self.budget_s,
            "interrupted": self.interrupted,
            "not_run": list(self.not_run),
            "failed": self.failed,
            "scenarios": [r.as_dict() for r in self.results],
        }
