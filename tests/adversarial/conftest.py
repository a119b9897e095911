"""Adversarial-client fixtures: a scripted runner for the in-process server
(`start_server`, from tests/conftest.py, which also has `tokenizer_dir` for server
subprocesses driven by `load_tests/load_server.py`)."""

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


@pytest.fixture
def runner(tokenizer: Any, word_ids: tuple[int, ...]) -> Iterator[ScriptedRunner]:
    r = ScriptedRunner(vocab=word_ids, eos=tokenizer.eos_token_id)
    yield r
    r.release()  # never leave the engine's worker thread blocked
