"""Fleet tests: the scripted runner for in-process servers (`start_server` in
tests/conftest.py), and the subprocess helpers of load_tests/ (servers, the router)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "load_tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))

from fakes import ScriptedRunner


@pytest.fixture
def runner(tokenizer: Any, word_ids: tuple[int, ...]) -> Iterator[ScriptedRunner]:
    r = ScriptedRunner(vocab=word_ids, eos=tokenizer.eos_token_id)
    yield r
    r.release()  # never leave the engine's worker thread blocked
