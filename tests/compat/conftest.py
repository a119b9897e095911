"""One real `sluiceway serve` on the default model for the whole module: the
clients people build on OpenAI-compatible servers, run as their users run them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from load_server import ServerProcess


@pytest.fixture(scope="package")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("compat") / "server.log"
    with ServerProcess.sluiceway(["--max-num-seqs", "8"], log) as server:
        yield server.url
