"""`checkpoint.heap.loading_heap`: while a model loads, glibc maps every
allocation of 1 MiB and more on its own (so a freed temporary leaves the
process), and after it serves those below 32 MiB from the heap again. Read off
glibc's chunk header: bit 2 of the size word before a chunk marks a mapped one."""

from __future__ import annotations

import ctypes

import pytest

from sluiceway.runner.checkpoint import heap

libc = heap._glibc()
pytestmark = pytest.mark.skipif(libc is None, reason="glibc's malloc only")

_IS_MMAPPED = 0x2


def _mapped_on_its_own(size: int) -> bool:
    assert libc is not None
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    pointer = libc.malloc(size)
    assert pointer
    try:
        header = ctypes.c_size_t.from_address(pointer - ctypes.sizeof(ctypes.c_size_t)).value
        return bool(header & _IS_MMAPPED)
    finally:
        libc.free(pointer)


def test_large_temporaries_are_mapped_while_loading_and_served_from_the_heap_after():
    # Freeing a mapped 30 MiB chunk raises glibc's own threshold to 30 MiB (or the
    # serving threshold, 32 MiB, is already fixed): 20 MiB then comes from the
    # heap, and stays there, free, once freed.
    _mapped_on_its_own(30 << 20)
    assert not _mapped_on_its_own(20 << 20)
    with heap.loading_heap():
        # more than the heap has free: mapped on its own, not grown into the heap
        assert _mapped_on_its_own(24 << 20)
        assert not _mapped_on_its_own(64 << 10)
    assert not _mapped_on_its_own(4 << 20)
    assert _mapped_on_its_own(64 << 20)


def test_the_serving_threshold_is_restored_when_loading_fails():
    with pytest.raises(RuntimeError), heap.loading_heap():
        raise RuntimeError("a load that fails")
    assert not _mapped_on_its_own(4 << 20)
