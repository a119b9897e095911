"""Every native kernel source builds for the CPUs other hosts have, not only for
this one: `library.py` compiles with `-march=native`, so an AVX512 host alone
would never see a kernel that cannot build where only AVX2 (or no AVX at all) is
there. Each ISA level's code carries its own target attributes; an always-inline
helper called from a function with fewer of them fails to build on such a host."""

from __future__ import annotations

import platform
import shutil
import subprocess

import pytest

from sluiceway.runner.native import library

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None, reason="needs a C compiler"
)

SOURCES = sorted(p.name for p in library.SOURCE_DIR.glob("*.c"))
# x86-64-v3: AVX2 and FMA (the CI hosts); x86-64: SSE2 only.
TARGETS = ["x86-64-v3", "x86-64"]


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 targets")
@pytest.mark.parametrize("march", TARGETS)
@pytest.mark.parametrize("source", SOURCES)
def test_a_kernel_builds_for_another_x86_level(tmp_path, source, march):
    flags = [f for f in library.CFLAGS if not f.startswith(("-march", "-O"))]
    command = [*library._compiler(), "-O1", f"-march={march}", *flags]
    command += ["-o", str(tmp_path / "k.so"), str(library.SOURCE_DIR / source)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
