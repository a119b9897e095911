"""Compile, cache and load the C kernels in this directory.

A kernel library is built with the system C compiler (`$CC`, default `cc`) and
`-march=native`, so it uses whatever vector instructions this CPU has; it is cached
under `cache_root()/native/` keyed by the source, the compiler command and this
CPU's feature flags, so a later process (or a later test) loads it in
milliseconds. The library links OpenMP by soname; torch has already loaded its own
`libgomp.so.1`, so the kernels run on torch's thread pool instead of starting a
second one that would fight it for the cores.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shlex
import subprocess
import tempfile
from pathlib import Path

from sluiceway.cache_paths import cache_root

log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parent
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=c11")


def _cpu_flags() -> str:
    """This CPU's feature flags (the `flags` line of /proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CC") or "cc")


def library_key(source: str) -> str:
    """What a cached build depends on: the source text and every other source here
    (headers, and the kernels `decode_one.c` compiles in), the compiler and its
    flags, and the CPU (`-march=native` output does not run everywhere)."""
    headers = "".join(p.read_text() for p in sorted(SOURCE_DIR.glob("*.[ch]")))
    digest = hashlib.sha256()
    for part in (source, headers, " ".join(_compiler() + list(CFLAGS)), _cpu_flags()):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:24]


def _build_dir() -> Path:
    root = cache_root()
    if root is None:  # caching is off: build for this process only
        return Path(tempfile.mkdtemp(prefix="sluiceway-native-"))
    return root / "native"


def compile_library(name: str) -> Path:
    """Path of the shared library built from `<name>.c`, compiling it unless a build
    for this source, compiler and CPU is cached. Raises `RuntimeError` with the
    compiler's message when the build fails. Concurrent builders are safe: each
    writes its own temporary file and renames it into place."""
    source = (SOURCE_DIR / f"{name}.c").read_text()
    directory = _build_dir()
    target = directory / f"{name}-{library_key(source)}.so"
    if target.is_file():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}-", suffix=".so")
    os.close(fd)
    command = [*_compiler(), *CFLAGS, "-o", tmp, str(SOURCE_DIR / f"{name}.c"), "-lm"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(
                f"{shlex.join(command)} failed ({result.returncode}): {result.stderr.strip()[-2000:]}"
            )
        os.replace(tmp, target)
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"could not run the C compiler ({shlex.join(command)}): {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    log.info("compiled %s", target)
    return target


@functools.cache
def load_library(name: str) -> ctypes.CDLL | None:
    """The loaded library for `<name>.c`, or None (with one warning) when it cannot be
    built or loaded here; callers then use their torch path. `SLUICEWAY_NATIVE=0`
    turns every native kernel off."""
    if os.environ.get("SLUICEWAY_NATIVE", "1") == "0":
        return None
    import torch  # noqa: F401  (its libgomp must be loaded before ours; see the module doc)

    try:
        return ctypes.CDLL(str(compile_library(name)))
    except (RuntimeError, OSError) as exc:
        log.warning("native kernel %s unavailable, using the torch path: %s", name, exc)
        return None


def bind(name: str, function: str, argtypes: list, restype=None):
    """`function` of library `name` with its ctypes signature set, or None when the
    library is unavailable (see `load_library`)."""
    lib = load_library(name)
    if lib is None:
        return None
    fn = getattr(lib, function)
    if fn.argtypes is None:
        fn.argtypes, fn.restype = argtypes, restype
    return fn


def load_kernels(
    name: str, available: str, signatures: dict[str, tuple[list, object]]
) -> ctypes.CDLL | None:
    """Library `name` with each function in `signatures` (`{function: (argtypes,
    restype)}`) bound, or None where it does not build or its `available()` says this
    build has no kernels (compiled for a CPU without their instructions)."""
    lib = load_library(name)
    if lib is None or not getattr(lib, available)():
        return None
    for function, (argtypes, restype) in signatures.items():
        fn = getattr(lib, function)
        fn.argtypes, fn.restype = argtypes, restype
    return lib
