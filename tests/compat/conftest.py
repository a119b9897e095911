"""One real `sluiceway serve` on the default model for the whole module: the
clients people build on OpenAI-compatible servers, run as their users run them."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "load_tests"))

from load_server import ServerProcess


@pytest.fixture(scope="package")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("compat") / "server.log"
    with ServerProcess.sluiceway(["--max-num-seqs", "8"], log) as server:
        yield server.url
