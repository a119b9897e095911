"""`checkpoint.heap.loading_heap`: while a model loads, glibc maps every
allocation of 1 MiB and more on its own (so a freed temporary leaves the
process), and after it serves those below 32 MiB from the heap again. Read off
glibc's chunk header (bit 2 of the size word before a chunk marks a mapped one),
in a fresh interpreter each: what the heap holds free depends on everything the
process allocated before."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from sluiceway.runner.checkpoint import heap

pytestmark = pytest.mark.skipif(heap._glibc() is None, reason="glibc's malloc only")

_PRELUDE = """
import ctypes
from sluiceway.runner.checkpoint import heap

libc = heap._glibc()
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]


def mapped_on_its_own(size):
    pointer = libc.malloc(size)
    assert pointer
    header = ctypes.c_size_t.from_address(pointer - ctypes.sizeof(ctypes.c_size_t)).value
    libc.free(pointer)
    return bool(header & 2)


# Freeing a mapped 30 MiB chunk raises glibc's own threshold to 30 MiB: 20 MiB
# then comes from the heap, and stays there, free, once freed.
mapped_on_its_own(30 << 20)
assert not mapped_on_its_own(20 << 20)
"""


def _run(body: str) -> None:
    script = _PRELUDE + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_large_temporaries_are_mapped_while_loading_and_served_from_the_heap_after():
    _run("""
        with heap.loading_heap():
            # more than the heap has free: mapped on its own, not grown into the heap
            assert mapped_on_its_own(24 << 20)
            assert not mapped_on_its_own(64 << 10)
        assert not mapped_on_its_own(4 << 20)
        assert mapped_on_its_own(64 << 20)
    """)


def test_without_it_glibc_grows_the_heap_for_the_same_allocation():
    """The check above can fail: glibc left alone serves 24 MiB from the heap."""
    _run("""
        assert not mapped_on_its_own(24 << 20)
    """)


def test_the_serving_threshold_is_restored_when_loading_fails():
    _run("""
        try:
            with heap.loading_heap():
                raise RuntimeError("a load that fails")
        except RuntimeError:
            pass
        # the loading threshold (1 MiB) would map this one
        assert not mapped_on_its_own(24 << 20)
        assert mapped_on_its_own(64 << 20)
    """)
