"""The short load run: locust (in its own process: it monkeypatches with gevent)
against a fake-runner server subprocess, a few seconds, failing on any failure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_short_locust_run(tokenizer_dir: Path, tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        str(REPO / "load_tests" / "run_load.py"),
        "--fake",
        "--tokenizer",
        str(tokenizer_dir),
        "--time",
        "4s",
        "-u",
        "6",
        "-r",
        "6",
        "--max-tokens",
        "24",
        "--out",
        str(tmp_path),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert (tmp_path / "load_stats.csv").exists() and (tmp_path / "report.html").exists()
