"""Per-key budgets (`--api-key-budgets FILE`): requests and tokens a minute for
each API key, as OpenAI's rate limits count them.

Each budget is a bucket that holds a minute's worth and refills continuously
(a key that used all of it has a sixtieth back each second). A generation
request takes one request, and tokens for its prompts plus `max_tokens` for
each choice where the request sets it (what it may cost, counted before it
runs, as OpenAI estimates). Over budget is a 429 `rate_limit_exceeded` with
`Retry-After`; every answer to a budgeted key carries OpenAI's
`x-ratelimit-limit-*`, `x-ratelimit-remaining-*` and `x-ratelimit-reset-*`
headers. Time is trio's clock, so tests run it on a `MockClock`.

The file is JSON: `{"keys": {"KEY": {"requests_per_minute": 60,
"tokens_per_minute": 40000, "project": "team-a"}}}`; either budget may be left
out (unlimited), and every key in it is an accepted key. Keys with the same
`project` share their files, batches and stored responses (`owners.py`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

import attrs
import trio
from quart import g

from sluiceway.api.errors import APIError
from sluiceway.config import KeyBudget


def load_key_budgets(path: str | Path) -> dict[str, KeyBudget]:
    """The budgets in `path`; ValueError naming what is wrong with it."""
    try:
        data = json.loads(Path(path).read_text())
        keys = data["keys"]
        budgets = {}
        for key, fields in keys.items():
            budget = KeyBudget(**fields)
            for name, value in attrs.asdict(budget).items():
                if name == "project":
                    if value is not None and (not isinstance(value, str) or not value):
                        raise ValueError(f"keys.{key}.project must be a non-empty string")
                elif value is not None and (not isinstance(value, int) or value < 1):
                    raise ValueError(f"keys.{key}.{name} must be a positive integer")
            budgets[str(key)] = budget
        return budgets
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"--api-key-budgets {path}: {exc}") from None


@attrs.define
class _Bucket:
    """Full until first used; `updated` is when it was last refilled."""

    per_minute: int
    level: float
    updated: float | None = None

    def refill(self, now: float) -> None:
        if self.updated is not None:
            gained = (now - self.updated) * self.per_minute / 60
            self.level = min(self.per_minute, self.level + gained)
        self.updated = now

    def seconds_until(self, amount: float) -> float:
        """How long until `amount` is there (0: it is)."""
        missing = min(amount, self.per_minute) - self.level
        return max(0.0, missing * 60 / self.per_minute)


class RateLimits:
    """The buckets of every budgeted key; owned by the event loop."""

    def __init__(self, budgets: Mapping[str, KeyBudget]) -> None:
        self._buckets: dict[str, dict[str, _Bucket]] = {}
        for key, budget in budgets.items():
            kinds = {"requests": budget.requests_per_minute, "tokens": budget.tokens_per_minute}
            self._buckets[key] = {
                kind: _Bucket(limit, float(limit))
                for kind, limit in kinds.items()
                if limit is not None
            }

    def _refilled(self, key: str) -> dict[str, _Bucket]:
        buckets = self._buckets.get(key, {})
        now = trio.current_time()
        for bucket in buckets.values():
            bucket.refill(now)
        return buckets

    def take(self, key: str | None, *, requests: int = 0, tokens: int = 0) -> None:
        """Takes from `key`'s budget (none: unlimited), or raises the 429 saying
        which budget is spent and when it has enough again; takes nothing then."""
        if key is None:
            return
        buckets = self._refilled(key)
        wanted = {"requests": requests, "tokens": tokens}
        for kind, bucket in buckets.items():
            wait = bucket.seconds_until(wanted[kind])
            if wait > 0:
                raise APIError(
                    429,
                    f"Rate limit reached for {kind} per minute "
                    f"(limit {bucket.per_minute}, remaining {int(bucket.level)}); "
                    f"retry in {wait:.1f}s.",
                    "rate_limit_error",
                    None,
                    "rate_limit_exceeded",
                    (("Retry-After", str(math.ceil(wait))), *self.headers(key)),
                )
        for kind, bucket in buckets.items():
            bucket.level -= wanted[kind]

    def headers(self, key: str | None) -> tuple[tuple[str, str], ...]:
        """OpenAI's rate-limit headers for `key` (none where it has no budget)."""
        out: list[tuple[str, str]] = []
        for kind, bucket in self._refilled(key).items() if key is not None else ():
            out += [
                (f"x-ratelimit-limit-{kind}", str(bucket.per_minute)),
                (f"x-ratelimit-remaining-{kind}", str(max(0, int(bucket.level)))),
                (f"x-ratelimit-reset-{kind}", f"{bucket.seconds_until(bucket.per_minute):.3f}s"),
            ]
        return tuple(out)


# The paths whose POSTs take a request from a key's budget (and tokens, counted by
# the route).
BUDGETED_PATHS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"}
)


def budgeted_key() -> str | None:
    """The budgeted API key of the request being served (None: it has none)."""
    return g.get("budgeted_key")


def take_tokens(
    limits: RateLimits, prompt_tokens: int, max_tokens: int | None, choices: int
) -> None:
    """Charges the current request's key for what it may cost: its prompts, and
    `max_tokens` for each choice where the request sets it."""
    limits.take(budgeted_key(), tokens=prompt_tokens + (max_tokens or 0) * choices)
