"""Deferred `triton.jit`: a kernel is jitted on its first launch, not at import.

`triton.jit` reads `TRITON_INTERPRET` when it wraps a function, so deferring it
makes the interpreter-or-compiler choice when the kernel is first needed: a test
process can turn the interpreter on after triton (or this package) was imported.
The kernels call no jitted `triton.language` helpers (those are fixed at triton's
import; see `_paged_attention.py`), so nothing else depends on import order.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class LazyKernel:
    """A triton kernel that is jitted the first time it is launched."""

    def __init__(self, fn: Callable[..., None]) -> None:
        self._fn = fn
        self._jitted: Any = None
        self._lock = threading.Lock()

    def _get(self) -> Any:
        if self._jitted is None:
            with self._lock:
                if self._jitted is None:
                    import triton

                    self._jitted = triton.jit(self._fn)
        return self._jitted

    @property
    def interpreted(self) -> bool:
        """Whether launches run in triton's CPU interpreter (`TRITON_INTERPRET=1`)."""
        from triton.runtime.interpreter import InterpretedFunction

        return isinstance(self._get(), InterpretedFunction)

    def __getitem__(self, grid: Any) -> Any:
        return self._get()[grid]


def lazy_jit(fn: Callable[..., None]) -> LazyKernel:
    return LazyKernel(fn)
