"""End to end through the real torch runner: a tiny random-weight Llama with the
SmolLM2 tokenizer's vocabulary, served over HTTP."""

from __future__ import annotations

from functools import partial
from typing import Any

import httpx
import pytest
import trio

from server_helpers import stream
from sluiceway.api.serve import RunningServer, serve_async
from sluiceway.config import EngineConfig, ServerConfig
from sluiceway.engine.engine import Engine

from .conftest import MODEL

torch = pytest.importorskip("torch")


async def test_batch_chat_equals_alone_with_real_runner(
    tokenizer: Any, tiny_runner_parts: Any
) -> None:
    from sluiceway.runner.model_runner import TorchModelRunner

    config, state_dict = tiny_runner_parts
    runner = TorchModelRunner(
        config, state_dict, dtype=torch.float32, block_size=16, num_blocks=128
    )
    engine = Engine(
        runner, tokenizer, EngineConfig(), eos_token_ids={tokenizer.eos_token_id}, max_model_len=512
    )
    convs = [[{"role": "user", "content": q}] for q in ("Hi there", "What is 2+2?", "Name a color")]
    greedy = {"temperature": 0, "max_tokens": 8, "ignore_eos": True}
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            server: RunningServer = await nursery.start(
                partial(
                    serve_async,
                    engine,
                    server_config=ServerConfig(port=0),
                    model_name=MODEL,
                    model_vocab_size=config.vocab_size,
                )
            )
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                batch = await stream(client, "/v1/chat/completions", {"messages": convs, **greedy})
                batch.check_well_formed()
                assert set(batch.finish_reasons().values()) == {"length"}
                for i, conv in enumerate(convs):
                    alone = await client.post(
                        "/v1/chat/completions", json={"messages": conv, **greedy}
                    )
                    choice = alone.json()["choices"][0]
                    assert choice["message"]["content"] == batch.texts()[i]
                    assert alone.json()["usage"]["completion_tokens"] == 8
                seeded = {
                    "messages": convs[0],
                    "temperature": 1.0,
                    "seed": 7,
                    "max_tokens": 6,
                    "n": 2,
                }
                first = (await client.post("/v1/chat/completions", json=seeded)).json()
                again = (await client.post("/v1/chat/completions", json=seeded)).json()
                assert [c["message"] for c in first["choices"]] == [
                    c["message"] for c in again["choices"]
                ]
            nursery.cancel_scope.cancel()
