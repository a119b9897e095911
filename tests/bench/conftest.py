"""Fixtures for the serve-bench tests: the real SmolLM2 tokenizer (loaded once), a
scripted runner, and a real sluiceway server on an ephemeral loopback port inside
the test's nursery."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import pytest
import trio

from sluiceway.api.serve import RunningServer, serve_async
from sluiceway.config import EngineConfig, ServerConfig
from sluiceway.engine.engine import Engine

from .serve_bench_fakes import CyclingRunner

MODEL = "bench-test-model"


@pytest.fixture
def bench_runner(word_ids: tuple[int, ...]) -> CyclingRunner:
    return CyclingRunner(vocab=word_ids)


@pytest.fixture
async def bench_server(
    bench_runner: CyclingRunner, tokenizer: Any
) -> AsyncIterator[RunningServer]:
    engine = Engine(
        bench_runner,
        tokenizer,
        EngineConfig(),
        eos_token_ids=frozenset({tokenizer.eos_token_id}),
        max_model_len=2048,
    )
    config = ServerConfig(host="127.0.0.1", port=0)
    async with trio.open_nursery() as nursery:
        server: RunningServer = await nursery.start(
            partial(
                serve_async,
                engine,
                server_config=config,
                model_name=MODEL,
                model_vocab_size=None,
                handle_signals=False,
            )
        )
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()
