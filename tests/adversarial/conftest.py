"""Adversarial-client fixtures: a scripted runner for the in-process server
(`start_server`, from tests/conftest.py, which also has `tokenizer_dir` for server
subprocesses driven by `load_tests/load_server.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fakes import ScriptedRunner


@pytest.fixture
def runner(tokenizer: Any, word_ids: tuple[int, ...]) -> Iterator[ScriptedRunner]:
    r = ScriptedRunner(vocab=word_ids, eos=tokenizer.eos_token_id)
    yield r
    r.release()  # never leave the engine's worker thread blocked
