"""How far a load has got: a tqdm bar (tensors and bytes) on a terminal, one log
line per stage otherwise."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

log = logging.getLogger("sluiceway.runner.loading")


class LoadProgress:
    """Counts the tensors and bytes read of `total_tensors` and `total_bytes`.
    `bar`: draw a tqdm bar on stderr (only where stderr is a terminal); without
    it, `stage` and `done` each log one line."""

    def __init__(self, name: str, total_tensors: int, total_bytes: int, *, bar: bool) -> None:
        self.name = name
        self.total_tensors, self.total_bytes = total_tensors, total_bytes
        self.tensors = self.bytes = 0
        self.started = time.monotonic()
        self._bar: Any = None
        if bar and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_bytes,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=f"loading {name}",
                leave=False,
                dynamic_ncols=True,
            )

    def stage(self, what: str) -> None:
        """A new stage of the load begins (a log line)."""
        log.info("%s: %s", self.name, what)

    def read(self, nbytes: int) -> None:
        """One more tensor of `nbytes` bytes has been read."""
        self.tensors += 1
        self.bytes += nbytes
        if self._bar is not None:
            self._bar.set_postfix_str(f"{self.tensors}/{self.total_tensors} tensors", refresh=False)
            self._bar.update(nbytes)

    def done(self) -> None:
        """The weights are all in place: close the bar and log the totals."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        log.info(
            "%s: read %d tensors, %.1f MB, in %.1f s",
            self.name,
            self.tensors,
            self.bytes / 1e6,
            time.monotonic() - self.started,
        )
