"""`sluiceway serve --tensor-parallel-size 2` as a subprocess: after SIGTERM, after a
Ctrl-C to its whole process group, and after SIGKILL (a crash: no code of its own
runs), no rank outlives the API process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import trio
from tp_helpers import alive, descendants

from polling import eventually

_URL = re.compile(r"serving .* at (http://[\d.]+:\d+)")


def serve(model_dir: Path, log: Path, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """Start `sluiceway serve -tp 2` in its own process group, as a shell starts a
    foreground job (so a Ctrl-C reaches the ranks too); return it and its URL once
    /health answers 200."""
    argv = [sys.executable, "-m", "sluiceway.cli", "serve", "--port", "0", "--model", str(model_dir)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*argv, "--tensor-parallel-size", "2", "--num-kv-blocks", "256",
             "--served-model-name", "test-model"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # across a process boundary: poll, bounded
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()}")
        match = _URL.search(log.read_text(errors="replace"))
        if match and httpx.get(match.group(1) + "/health", timeout=5).status_code == 200:
            return proc, match.group(1)
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    raise TimeoutError(log.read_text())


@pytest.mark.parametrize("how", ["sigterm", "sigint-to-group", "sigkill"])
async def test_no_rank_outlives_the_server(model_dir: Path, tmp_path: Path, how: str) -> None:
    log = tmp_path / "server.log"
    proc, _ = await trio.to_thread.run_sync(serve, model_dir, log)
    try:
        # The two ranks, the fork server they came from and multiprocessing's
        # resource tracker: none may be left.
        spawned = descendants(proc.pid)
        assert len(spawned) >= 3, log.read_text()[-3000:]
        if how == "sigterm":
            proc.send_signal(signal.SIGTERM)
        elif how == "sigint-to-group":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.kill()
        code = await trio.to_thread.run_sync(lambda: proc.wait(timeout=60))
        await eventually(lambda: not any(alive(pid) for pid in spawned), 30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == (-signal.SIGKILL if how == "sigkill" else 0), log.read_text()[-3000:]
