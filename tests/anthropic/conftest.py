"""A server whose model writes given texts (`script_runner.ScriptRunner`), and
Anthropic's own SDK pointed at it."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import pytest
import trio

import anthropic
from script_runner import ScriptRunner

MODEL = "test-model"  # the name tests/conftest.py serves under
T = TypeVar("T")


async def in_thread(fn: Callable[[], T]) -> T:
    """`fn()` (the SDK's sync client) on a worker thread, within 30 s."""
    with trio.fail_after(30):
        return await trio.to_thread.run_sync(fn)


def sdk(server: Any, api_key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=api_key, max_retries=0, timeout=30)


@pytest.fixture
def serve_texts(tokenizer: Any, serve_runner: Callable[..., Any]) -> Callable[..., Any]:
    """`async with serve_texts([text, ...], **ServerConfig kwargs) as (server, runner):`
    a server whose k-th sequence writes `texts[k % len(texts)]`."""

    @asynccontextmanager
    async def serve(texts: list[str], gated: bool = False, **server_kw: Any) -> Any:
        runner = ScriptRunner.of(tokenizer, texts, gated=gated)
        async with serve_runner(runner, **server_kw) as server:
            yield server, runner

    return serve
