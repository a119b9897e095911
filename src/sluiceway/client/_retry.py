"""Retry policy: exponential backoff with jitter that honours Retry-After."""

from __future__ import annotations

import email.utils
import random
import time

import attrs

RETRYABLE_STATUS = frozenset({429, 503})


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), else None."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    if seconds != seconds:  # NaN
        return None
    return max(0.0, seconds)


@attrs.frozen
class RetryPolicy:
    """How long to wait before retry number ``attempt`` (0-based).

    Without Retry-After: ``min(max_delay, base_delay * 2**attempt)`` scaled by a
    random factor in ``[1 - jitter, 1]`` (so clients that failed together spread
    out). With Retry-After: exactly what the server asked, capped at
    ``max_retry_after`` (a server asking for longer gets the error instead).
    """

    max_retries: int = 2
    base_delay: float = 0.5
    max_delay: float = 8.0
    jitter: float = 0.5
    max_retry_after: float = 60.0

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float | None:
        """Seconds to sleep before retrying, or None when not to retry."""
        if attempt >= self.max_retries:
            return None
        if retry_after is not None:
            return None if retry_after > self.max_retry_after else retry_after
        backoff = min(self.max_delay, self.base_delay * (2**attempt))
        return backoff * (1.0 - self.jitter * rng.random())
