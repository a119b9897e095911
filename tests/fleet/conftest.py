"""Fleet tests: the scripted runner for in-process servers (`start_server` in
tests/conftest.py), and the subprocess helpers of load_tests/ (servers, the router)."""

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
