"""A rank that dies or hangs fails the engine at once (a dead rank) or within the
step watchdog (a hung one): open streams get an error event, /health turns 503,
and no rank process is left. Ranks of a served model die with the API process."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch
import trio
from tp_helpers import alive, start_ranks, tiny_llama

from polling import eventually
from server_helpers import COMPLETIONS, StreamResult, completion, parse_event
from sluiceway.config import EngineConfig
from sluiceway.runner.tensor_parallel import TensorParallelRunner

# The step watchdog; a hung rank's test waits this long, a killed rank's must not.
WATCHDOG_S = 5.0


@pytest.fixture
def ranks(tokenizer: Any) -> Iterator[TensorParallelRunner]:
    """Two ranks over a tiny Llama with the default tokenizer's vocabulary, whose
    EOS never wins a greedy draw (its output row is zero), so streams run on.
    A step of it takes milliseconds, so the watchdog never fires on a sound one."""
    model = tiny_llama(kv_heads=2, vocab=len(tokenizer))
    with torch.no_grad():
        model.lm_head.weight[tokenizer.eos_token_id] = 0
    runner = start_ranks(model, 2, step_timeout=WATCHDOG_S, block_size=16, num_blocks=128)
    try:
        yield runner
    finally:
        runner.close()


async def _stream_until(client: httpx.AsyncClient, chunks: int, then: Any) -> StreamResult:
    """Stream a long completion; after `chunks` events call `then()`; read to the end."""
    body = completion("the river", max_tokens=1000, stream=True)
    async with client.stream("POST", COMPLETIONS, json=body) as response:
        result = StreamResult(response.status_code)
        done = False
        async for line in response.aiter_lines():
            parse_event(line, result)
            if len(result.chunks) == chunks and not done:
                done = True
                then()
    return result


async def _fails_cleanly(serve_runner: Any, ranks: TensorParallelRunner, fault: Any) -> str:
    config = EngineConfig(step_timeout=WATCHDOG_S, burst_window=0)
    async with (
        serve_runner(ranks, engine_config=config) as server,
        httpx.AsyncClient(base_url=server.url, timeout=60) as client,
    ):
        with trio.fail_after(6 * WATCHDOG_S):  # a hang becomes a failure
            result = await _stream_until(client, 3, fault)
            assert result.status == 200 and result.done
            assert [e["code"] for e in result.errors] == ["engine_unhealthy"]
            health = await client.get("/health")
            assert health.status_code == 503 and health.json()["status"] == "unhealthy"
            # The runner ends every rank before its step raises; an abandoned
            # (watchdog) step does so on the model thread, a moment later.
            await eventually(lambda: not any(alive(p) for p in ranks.rank_pids), 2 * WATCHDOG_S)
        failure = server.state.engine.failure
        assert failure is not None
        return failure


async def test_a_killed_rank_fails_streams_and_health_and_leaves_no_rank(
    serve_runner: Any, ranks: TensorParallelRunner
) -> None:
    failure = await _fails_cleanly(
        serve_runner, ranks, lambda: os.kill(ranks.rank_pids[1], signal.SIGKILL)
    )
    # Failed on the rank's exit (or rank 0's broken collective), not on the watchdog.
    assert "watchdog" not in failure and "rank" in failure, failure


async def test_a_hung_rank_fails_within_the_watchdog_and_leaves_no_rank(
    serve_runner: Any, ranks: TensorParallelRunner
) -> None:
    failure = await _fails_cleanly(
        serve_runner, ranks, lambda: os.kill(ranks.rank_pids[1], signal.SIGSTOP)
    )
    assert "watchdog" in failure or "no reply" in failure, failure
