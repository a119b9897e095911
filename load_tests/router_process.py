"""`vllm-router` as a subprocess on loopback, started and stopped by its PID."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

# `--kv-events-config` for a replica on loopback: its publisher and replay sockets
# on ports the OS picks (the router learns them from /kv_event_sources).
LOOPBACK_KV_EVENTS = json.dumps(
    {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://127.0.0.1:0",
        "replay_endpoint": "tcp://127.0.0.1:0",
    }
)


def router_binary() -> str | None:
    """The `vllm-router` launcher: next to this interpreter (a venv), else on PATH."""
    local = Path(sys.executable).parent / "vllm-router"
    return str(local) if local.exists() else shutil.which("vllm-router")


def free_port() -> int:
    """A port free on 127.0.0.1 just now (the router cannot be told to pick one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RouterProcess:
    """The router in front of `workers`. `start` returns once it reports every worker
    healthy (`/readiness`); `stop` terminates it, killing it if it lingers."""

    def __init__(self, workers: list[str], policy: str, log_path: Path, *extra: str) -> None:
        binary = router_binary()
        assert binary is not None
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{free_port()}"
        self.argv = [
            binary,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--prometheus-host", "127.0.0.1",
            "--prometheus-port", self.metrics_url.rsplit(":", 1)[1],
            "--worker-urls", *workers,
            "--policy", policy,
            # Notice a dead replica within about a second, and retry on another at once.
            "--health-check-interval-secs", "1",
            "--health-failure-threshold", "1",
            "--cb-failure-threshold", "1",
            "--retry-max-retries", "4",
            "--retry-initial-backoff-ms", "10",
            "--worker-startup-check-interval", "1",
            *extra,
        ]  # fmt: skip
        self.workers = workers
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, limit_s: float = 30.0) -> RouterProcess:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:  # across a process boundary: poll, bounded
            if self.proc.poll() is not None:
                raise RuntimeError(f"router exited with {self.proc.returncode}:\n{self.log()}")
            if self.healthy_workers() == len(self.workers):
                return self
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"router not ready within {limit_s} s:\n{self.log()}")

    def healthy_workers(self) -> int | None:
        try:
            r = httpx.get(self.url + "/readiness", timeout=2)
        except httpx.HTTPError:
            return None
        return int(r.json().get("healthy_workers", 0)) if r.status_code == 200 else None

    def counter(self, name: str) -> float:
        """The sum of a counter's samples on the router's own metrics endpoint."""
        text = httpx.get(self.metrics_url + "/metrics", timeout=5).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name + "{") or line.startswith(name + " ")
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
