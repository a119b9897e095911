"""Fixtures for hub ids, imported by the conftest of each test package that
fetches: a stand-in hub on 127.0.0.1 reached through `HF_ENDPOINT`, with the
Hugging Face cache in the test's own directory and no token, offline switch or
saved login of the developer's leaking in."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_stand_in import StandInHub


@pytest.fixture
def hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HF_HOME in the test's directory; the rest of the environment as a user
    with no token and no offline switch has it. huggingface_hub reads some
    settings once, at import, so those are set on its constants too."""
    from huggingface_hub import constants

    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    for name in (
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_ENDPOINT",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    return home


@pytest.fixture
def hub(hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandInHub]:
    """A running stand-in hub that HF_ENDPOINT points at; stopped after the test."""
    stand_in = StandInHub().start()
    monkeypatch.setenv("HF_ENDPOINT", stand_in.url)
    try:
        yield stand_in
    finally:
        stand_in.stop()


@pytest.fixture
def quick_resume(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub resumes a dropped download from the last whole chunk it
    wrote, after a second's pause: chunks of 256 bytes (not 10 MiB) let a tiny
    file be cut mid-way, and the stand-in needs no pause."""
    from types import SimpleNamespace

    from huggingface_hub import constants, file_download

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 256)
    monkeypatch.setattr(file_download, "time", SimpleNamespace(sleep=lambda seconds: None))
