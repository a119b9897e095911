"""The probe needs only the client: importing it (and its command) loads no torch,
transformers, server or engine code."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
import sluiceway.probe, sluiceway.probe.command
heavy = [m for m in sys.modules if m.split(".")[0] in ("torch", "transformers")
         or m.startswith(("sluiceway.api", "sluiceway.engine", "sluiceway.runner"))]
assert not heavy, heavy
"""


def test_the_probe_imports_no_server_code() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
