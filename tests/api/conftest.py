"""Fixtures: the real SmolLM2 tokenizer (loaded once), a scripted runner, and a real
server on an ephemeral loopback port inside the test's nursery."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest

from sluiceway.api.serve import RunningServer

from .fakes import ScriptedRunner

MODEL = "test-model"  # the name tests/conftest.py serves under


@pytest.fixture
def runner(tokenizer: Any, word_ids: tuple[int, ...]) -> Iterator[ScriptedRunner]:
    r = ScriptedRunner(vocab=word_ids, eos=tokenizer.eos_token_id)
    yield r
    r.release()  # never leave the engine's worker thread blocked


@pytest.fixture
async def server(start_server: Callable[..., Any]) -> AsyncIterator[RunningServer]:
    async with start_server() as s:
        yield s


@pytest.fixture
async def client(server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        yield c
