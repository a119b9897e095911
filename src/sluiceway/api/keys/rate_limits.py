"""Per-key budgets (`--api-key-budgets FILE`): requests and tokens a minute for
each API key, as OpenAI's rate limits count them.

Each budget is a bucket that holds a minute's worth and refills continuously
(a key that used all of it has a sixtieth back each second). A POST to a
generation, embeddings, Files or Batch path takes one request. A generation
takes, before it runs, what it may cost as OpenAI estimates it: its prompts,
and for each choice `max_tokens`, or without it the rest of the context; when
it ends (done, failed, cancelled or its client gone) the key is charged what it
used instead, its prompts and the tokens generated (`TokenCharge.settle`).
Embeddings take their inputs. A Batch API line takes a request and its tokens
from the key that created its batch, waiting for them where a direct request
would be refused. Over budget is a 429 `rate_limit_exceeded` with
`Retry-After`; an estimate above the key's tokens a minute can never fit and is
refused at once, as OpenAI does ("Request too large"). Every answer to a
budgeted key carries OpenAI's `x-ratelimit-limit-*`, `x-ratelimit-remaining-*`
and `x-ratelimit-reset-*` headers. Time is trio's clock, so tests run it on a
`MockClock`.

The file is JSON: `{"keys": {"KEY": {"requests_per_minute": 60,
"tokens_per_minute": 40000, "project": "team-a"}}}`; either budget may be left
out (unlimited), and every key in it is an accepted key. Keys with the same
`project` share their files, batches and stored responses (`owners.py`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs
import trio
from quart import g

from sluiceway.api.http.errors import APIError
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
    """Full until first used; `updated` is when it was last refilled. `level` is
    below zero while the key owes more than it had (a request that used more than
    was held for it)."""

    per_minute: int
    level: float
    updated: float | None = None

    def refill(self, now: float) -> None:
        if self.updated is not None:
            gained = (now - self.updated) * self.per_minute / 60
            self.level = min(self.per_minute, self.level + gained)
        self.updated = now

    def seconds_until(self, amount: float) -> float:
        """How long until `amount` (at most `per_minute`) is there (0: it is)."""
        return max(0.0, (amount - self.level) * 60 / self.per_minute)


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

    def _wait(self, key: str, wanted: Mapping[str, int], model: str) -> tuple[str, float]:
        """The budget `wanted` waits longest for and how long (0: none), with every
        bucket refilled. Raises the 429 of a request that no wait lets through."""
        buckets = self._refilled(key)
        tokens = buckets.get("tokens")
        if tokens is not None and wanted["tokens"] > tokens.per_minute:
            raise _too_large(model, tokens.per_minute, wanted["tokens"], self.headers(key))
        waits = [(kind, b.seconds_until(wanted[kind])) for kind, b in buckets.items()]
        return max(waits, key=lambda wait: wait[1], default=("requests", 0.0))

    def take(self, key: str | None, *, requests: int = 0, tokens: int = 0, model: str = "") -> None:
        """Takes from `key`'s budget (none: unlimited), or raises the 429 saying
        which budget is spent and when it has enough again; takes nothing then.
        More tokens than the key has a minute is refused at once, naming `model`."""
        if key is None:
            return
        wanted = {"requests": requests, "tokens": tokens}
        kind, wait = self._wait(key, wanted, model)
        if wait > 0:
            bucket = self._buckets[key][kind]
            raise APIError(
                429,
                f"Rate limit reached for {kind} per minute "
                f"(limit {bucket.per_minute}, remaining {max(0, int(bucket.level))}); "
                f"retry in {wait:.1f}s.",
                "rate_limit_error",
                None,
                "rate_limit_exceeded",
                (("Retry-After", str(math.ceil(wait))), *self.headers(key)),
            )
        self._take(key, wanted)

    async def take_when_there(
        self, key: str | None, *, requests: int = 0, tokens: int = 0, model: str = ""
    ) -> None:
        """As `take`, but waits until `key`'s budget has it instead of refusing, for
        work nobody is waiting on (a batch line). Raises only the 429 of more tokens
        than the key has a minute. Cancellation ends the wait, taking nothing."""
        if key is None:
            return
        wanted = {"requests": requests, "tokens": tokens}
        while True:
            _, wait = self._wait(key, wanted, model)
            if wait <= 0:
                self._take(key, wanted)
                return
            # Another request of the key may take the refill first: then wait again.
            await trio.sleep(wait)

    def _take(self, key: str, wanted: Mapping[str, int]) -> None:
        for kind, bucket in self._buckets.get(key, {}).items():
            bucket.level -= wanted[kind]

    def give_back(self, key: str, tokens: float) -> None:
        """Returns `tokens` to `key`'s token budget (negative: takes them), never
        filling it beyond a minute's worth."""
        bucket = self._refilled(key).get("tokens")
        if bucket is not None:
            bucket.level = min(bucket.per_minute, bucket.level + tokens)

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


def _too_large(
    model: str, limit: int, requested: int, headers: tuple[tuple[str, str], ...]
) -> APIError:
    """OpenAI's answer to a request no wait lets through. No Retry-After: a retry
    as it is fails the same."""
    return APIError(
        429,
        f"Request too large for {model or 'this model'} on tokens per min (TPM): "
        f"Limit {limit}, Requested {requested}. The input or output tokens must be "
        "reduced in order to run successfully (without max_tokens a request is "
        "counted as using the rest of the context).",
        "tokens",
        None,
        "rate_limit_exceeded",
        headers,
    )


@attrs.define(eq=False)
class TokenCharge:
    """The tokens a request took from its key's budget before it ran, for what it
    might cost; `settle` charges what it did cost instead. Owned by the request."""

    limits: RateLimits
    key: str | None
    estimate: int
    settled: bool = False

    def settle(self, used: int) -> None:
        """Gives back what the estimate held beyond `used` tokens (or takes what
        `used` is beyond it). Only the first call counts, so every way out of a
        request may call it."""
        if self.settled:
            return
        self.settled = True
        if self.key is not None and used != self.estimate:
            self.limits.give_back(self.key, self.estimate - used)


# The paths whose POSTs take a request from a key's budget (tokens are counted by
# the generation and embeddings routes, and for a batch by its lines).
BUDGETED_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
        "/v1/embeddings",
        "/v1/files",
        "/v1/batches",
    }
)


def budgeted_key() -> str | None:
    """The budgeted API key of the request being served (None: it has none)."""
    return g.get("budgeted_key")


def generation_estimate(
    prompt_lengths: Iterable[int], max_tokens: int | None, choices_per_prompt: int, context: int
) -> int:
    """What a generation may cost, as OpenAI counts it before it runs: each prompt,
    and for each of its choices `max_tokens`, or without it what the `context`
    leaves after the prompt (what the engine may then generate)."""
    return sum(
        length + choices_per_prompt * (max_tokens if max_tokens is not None else context - length)
        for length in prompt_lengths
    )


async def hold_tokens(
    limits: RateLimits, key: str | None, estimate: int, *, model: str, wait: bool = False
) -> TokenCharge:
    """Takes `estimate` tokens from `key`'s budget for a request about to run (a
    429 when they are not there; with `wait`, for background work, it waits for
    them instead). The request settles the charge when it ends."""
    if wait:
        await limits.take_when_there(key, tokens=estimate, model=model)
    else:
        limits.take(key, tokens=estimate, model=model)
    return TokenCharge(limits, key, estimate)
