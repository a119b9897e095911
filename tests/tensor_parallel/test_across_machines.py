"""Ranks that join from elsewhere (checked over loopback): a server that spawns only
rank 0 (LOCAL_WORLD_SIZE=1) and a rank 1 started on its own with the torchrun-style
variables serve a completion together, and rank 1 exits when the server stops."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
from test_no_orphan_ranks import serve

from server_helpers import COMPLETIONS, completion


def test_a_rank_started_elsewhere_joins_and_leaves_with_the_server(
    model_dir: Path, tmp_path: Path
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE="2")
    remote_log = tmp_path / "rank1.log"
    with remote_log.open("wb") as out:
        remote = subprocess.Popen(
            [sys.executable, "-m", "sluiceway.runner.tensor_parallel.remote",
             "--model", str(model_dir), "--tensor-parallel-size", "2", "--num-kv-blocks", "256"],
            stdout=out, stderr=subprocess.STDOUT, env=dict(env, RANK="1"),
        )  # fmt: skip
    server = None
    try:
        server, url = serve(model_dir, tmp_path / "server.log", dict(env, LOCAL_WORLD_SIZE="1"))
        r = httpx.post(url + COMPLETIONS, json=completion("the river", max_tokens=5), timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5, r.text
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
        # Rank 0's end breaks rank 1's wait for the next command: it exits by itself.
        code = remote.wait(timeout=60)
    finally:
        for proc in (server, remote):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    # Rank 0 either relays a shutdown (its pipe closed first: status 0) or ends
    # before it can (its lifeline closed first: rank 1 sees it gone, status 1).
    log = remote_log.read_text()
    assert code == 0 or (code == 1 and "rank 0 went away" in log), log
