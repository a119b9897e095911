"""Keeping a load's temporaries out of the process's resident memory.

Packing a tensor makes temporaries several times its packed size, freed before
the next one. glibc maps large allocations on their own and unmaps them when
freed, but after the first such free it raises that threshold to the freed
size, so later temporaries come from the heap, whose freed pages stay counted in
RSS: the peak of a load grows by the largest temporaries. `loading_heap` fixes
the threshold at 1 MiB while a model loads, then at 32 MiB (glibc's own ceiling
for it), so a step's activations still come from the heap, without a page fault
each, and returns the heap's free pages. Nothing happens where the C library is
not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Iterator
from contextlib import contextmanager

_M_MMAP_THRESHOLD = -3
_LOADING_THRESHOLD = 1 << 20
_SERVING_THRESHOLD = 32 << 20


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
    except (OSError, AttributeError):  # not glibc: no mallopt or malloc_trim
        return None
    return libc


@contextmanager
def loading_heap() -> Iterator[None]:
    """Large allocations mapped on their own while the body runs (a model
    loading), the serving threshold and the free heap pages returned after it,
    also when it raises."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, _LOADING_THRESHOLD)
    try:
        yield
    finally:
        if libc is not None:
            libc.mallopt(_M_MMAP_THRESHOLD, _SERVING_THRESHOLD)
            libc.malloc_trim(0)
