"""Reliability fixtures: the real SmolLM2 tokenizer (also saved as a plain tokenizer
directory for subprocess servers), a fault-injecting runner, and an in-process
server on an ephemeral loopback port."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from reliability_fakes import FaultRunner

MODEL = "test-model"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def runner(tokenizer: Any, word_ids: tuple[int, ...]) -> Iterator[FaultRunner]:
    r = FaultRunner(vocab=word_ids, eos=tokenizer.eos_token_id)
    yield r
    r.release()  # never leave the engine's worker thread blocked


