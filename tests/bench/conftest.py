"""Fixtures for the serve-bench tests: the real SmolLM2 tokenizer (loaded once), a
scripted runner, and a real sluiceway server on an ephemeral loopback port inside
the test's nursery."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from sluiceway.api.serve import RunningServer

from .serve_bench_fakes import CyclingRunner

MODEL = "bench-test-model"


@pytest.fixture
def bench_runner(word_ids: tuple[int, ...]) -> CyclingRunner:
    return CyclingRunner(vocab=word_ids)


@pytest.fixture
async def bench_server(
    bench_runner: CyclingRunner, serve_runner: Callable[..., Any]
) -> AsyncIterator[RunningServer]:
    async with serve_runner(bench_runner, model_name=MODEL) as server:
        yield server
