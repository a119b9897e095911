"""Adversarial-client fixtures: the real SmolLM2 tokenizer saved as a plain directory
(for server subprocesses, `load_tests/load_server.py`), a scripted runner, and an
in-process server on an ephemeral loopback port (`start_server`, from tests/conftest.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
# The server subprocess control lives in load_tests/.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "load_tests"))
# The scripted runner the API tests use.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))

from fakes import ScriptedRunner


@pytest.fixture(scope="session")
def tokenizer_dir(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tokenizer as a plain directory: subprocess servers load it in ~1 s."""
    path = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def runner(tokenizer: Any, word_ids: tuple[int, ...]) -> Iterator[ScriptedRunner]:
    r = ScriptedRunner(vocab=word_ids, eos=tokenizer.eos_token_id)
    yield r
    r.release()  # never leave the engine's worker thread blocked
