"""The load one scenario puts on the server, counted as it is sent."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import attrs

from sluiceway.probe.result import Load


class LoadExceededError(RuntimeError):
    """A scenario tried to send more than its stated request count (a probe bug:
    the stated load is a promise to the server's operator)."""


@attrs.define
class Ledger:
    """Counts requests, the most in flight at once and the largest ``max_tokens``;
    refuses a request beyond ``max_requests``."""

    max_requests: int
    requests: int = 0
    in_flight: int = 0
    peak: int = 0
    max_tokens: int = 0
    kinds: dict[str, int] = attrs.field(factory=dict)

    @contextmanager
    def request(self, path: str, body: Mapping[str, Any]) -> Iterator[None]:
        """Account for one request while the block runs (sent to closed)."""
        if self.requests >= self.max_requests:
            raise LoadExceededError(f"more than the stated {self.max_requests} requests")
        max_tokens = int(body.get("max_tokens") or 0)
        kind = describe(path, body)
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        self.requests += 1
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        self.max_tokens = max(self.max_tokens, max_tokens)
        try:
            yield
        finally:
            self.in_flight -= 1

    def load(self) -> Load:
        return Load(self.requests, self.peak, self.max_tokens, dict(self.kinds))


def describe(path: str, body: Mapping[str, Any]) -> str:
    """One line for a kind of request: endpoint and the parameters that set its cost
    or its shape, e.g. ``POST /v1/chat/completions stream n=4 max_tokens=32``."""
    parts = [f"POST {path}"]
    if body.get("stream"):
        parts.append("stream")
    prompts = body.get("prompt")
    if isinstance(prompts, list) and prompts and not isinstance(prompts[0], int):
        parts.append(f"prompts={len(prompts)}")
    for key in ("n", "max_tokens"):
        if body.get(key) is not None:
            parts.append(f"{key}={body[key]}")
    parts += [key for key in ("stop", "logprobs", "tools", "response_format") if body.get(key)]
    return " ".join(parts)
