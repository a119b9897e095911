"""Start a sluiceway server subprocess on a loopback port and stop it by its PID.

The server picks its own port (`--port 0`); its log names the URL. Output goes to
a log file, never a pipe, so a chatty server can never block on a full pipe.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

_URL = re.compile(r"(?:LISTENING|serving .* at) (http://[\d.]+:\d+)")
REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


class ServerProcess:
    def __init__(self, argv: list[str], log_path: Path, *, start_limit_s: float = 180.0) -> None:
        self.argv = argv
        self.log_path = log_path
        self.start_limit_s = start_limit_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    @classmethod
    def sluiceway(cls, flags: list[str], log_path: Path, **kw: float) -> ServerProcess:
        return cls([str(BIN / "sluiceway"), "serve", "--port", "0", *flags], log_path, **kw)

    @classmethod
    def fake(cls, tokenizer_dir: Path | str, flags: list[str], log_path: Path, **kw: float) -> ServerProcess:
        script = REPO / "load_tests" / "fake_server.py"
        argv = [sys.executable, str(script), "--tokenizer", str(tokenizer_dir), *flags]
        return cls(argv, log_path, **kw)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        deadline = time.monotonic() + self.start_limit_s
        while time.monotonic() < deadline:  # across a process boundary: poll, bounded
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            match = _URL.search(self.log())
            if match:
                self.url = match.group(1)
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return self
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"server did not start within {self.start_limit_s} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return -1

    def threads(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
        return -1

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def signal(self, signum: int = signal.SIGTERM) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signum)

    def wait(self, limit_s: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=limit_s)

    def stop(self, grace_s: float = 40.0) -> int:
        """SIGTERM (drain), then SIGKILL if it outlives `grace_s`. Returns the exit code."""
        if self.proc is None:
            return 0
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=10)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def metrics(url: str) -> dict[str, float]:
    """The server's /metrics as {name{labels}: value}."""
    out = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out
