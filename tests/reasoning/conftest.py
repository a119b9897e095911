"""A server whose model writes given texts under a reasoning model's chat template
(Qwen3's shape: `enable_thinking: false` writes an empty thinking block), and the
openai SDK pointed at it."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import openai
import pytest
import trio

from script_runner import ScriptRunner

MODEL = "test-model"  # the name tests/conftest.py serves under
T = TypeVar("T")

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% if persona is defined %}({{ persona }}) {% endif %}"
    "{% endif %}"
)


async def in_thread(fn: Callable[[], T]) -> T:
    """`fn()` (the SDK's sync client) on a worker thread, within 30 s."""
    with trio.fail_after(30):
        return await trio.to_thread.run_sync(fn)


def oai(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)


@pytest.fixture
def serve_texts(tokenizer: Any, serve_runner: Callable[..., Any]) -> Callable[..., Any]:
    """`async with serve_texts([text, ...], **ServerConfig kwargs) as (server, runner):`
    the k-th sequence writes `texts[k % len(texts)]`; the reasoning template and the
    qwen3 parser unless the kwargs say otherwise."""

    @asynccontextmanager
    async def serve(texts: list[str], gated: bool = False, **server_kw: Any) -> Any:
        runner = ScriptRunner.of(tokenizer, texts, gated=gated)
        server_kw.setdefault("chat_template", TEMPLATE)
        server_kw.setdefault("reasoning_parser", "qwen3")
        async with serve_runner(runner, **server_kw) as server:
            yield server, runner

    return serve
