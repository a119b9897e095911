"""The load one scenario puts on the server, counted as it is sent."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

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

    @contextmanager
    def request(self, max_tokens: int) -> Iterator[None]:
        """Account for one request while the block runs (sent to closed)."""
        if self.requests >= self.max_requests:
            raise LoadExceededError(f"more than the stated {self.max_requests} requests")
        self.requests += 1
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        self.max_tokens = max(self.max_tokens, max_tokens)
        try:
            yield
        finally:
            self.in_flight -= 1

    def load(self) -> Load:
        return Load(self.requests, self.peak, self.max_tokens)
