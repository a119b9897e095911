"""The next-token masks of one step's constrained rows, filled while the model runs.

The engine starts a fill when it hands a step to the runner; the fill runs on a
thread of its own in llguidance's executor, which computes the rows in parallel
without the GIL; the runner's sampler waits for it only after the forward pass, so
the masks cost the step nothing while they take less time than the model.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Sequence

import llguidance
import llguidance.numpy
import numpy as np

from sluiceway.grammar.compiler import GrammarMatcher
from sluiceway.grammar.thinking import ThinkingMatcher, mask_sources

_lock = threading.Lock()
_thread: concurrent.futures.ThreadPoolExecutor | None = None
_executor: llguidance.LLExecutor | None = None


def _pool() -> tuple[concurrent.futures.ThreadPoolExecutor, llguidance.LLExecutor]:
    global _thread, _executor
    with _lock:
        if _thread is None or _executor is None:
            _thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sluiceway-masks")
            _executor = llguidance.LLExecutor()
        return _thread, _executor


class TokenMasks:
    """Allowed-token bitmasks for `rows` (row indices among the step's sampled rows):
    `wait()` gives an int32 array `[len(rows), ceil(vocab / 32)]`, bit `t % 32` of
    word `t // 32` set where token t is allowed."""

    def __init__(
        self, rows: Sequence[int], future: concurrent.futures.Future[tuple[np.ndarray, float]]
    ) -> None:
        self.rows = tuple(rows)
        self._future = future
        self.fill_seconds = 0.0  # how long the fill took (on its own thread), once waited
        self.wait_seconds = 0.0  # how long `wait` blocked: the part the model did not hide

    def wait(self) -> np.ndarray:
        """Block until the fill is done; raises what the fill raised."""
        start = time.perf_counter()
        try:
            bitmask, self.fill_seconds = self._future.result()
            return bitmask
        finally:
            self.wait_seconds += time.perf_counter() - start


def start_fill(rows: Sequence[tuple[int, GrammarMatcher | ThinkingMatcher]]) -> TokenMasks:
    """Start filling the masks of `(row, matcher)` pairs (at least one, all of one
    vocabulary): `GrammarMatcher`s, or `ThinkingMatcher`s, whose rows are left
    out while they think freely and allow one token while they force a tag. The
    matchers must not change until `wait()` has returned."""
    thread, executor = _pool()
    vocab_size = rows[0][1].vocab_size
    masked = [(row, source) for row, source in mask_sources(rows) if source is not None]
    matchers = [
        (source.raw, i) for i, (_, source) in enumerate(masked) if isinstance(source, GrammarMatcher)
    ]
    forced = [(i, source) for i, (_, source) in enumerate(masked) if isinstance(source, int)]

    def fill() -> tuple[np.ndarray, float]:
        start = time.perf_counter()
        bitmask = llguidance.numpy.allocate_token_bitmask(len(masked), vocab_size)
        if matchers:
            llguidance.numpy.fill_next_token_bitmask_par(executor, matchers, bitmask)
        for i, token in forced:
            bitmask[i] = 0
            bitmask[i, token // 32] = np.array(1 << (token % 32), dtype=np.uint32).view(np.int32)
        return bitmask, time.perf_counter() - start

    return TokenMasks([row for row, _ in masked], thread.submit(fill))
