"""What a replica serves the fleet: vLLM-named metrics, the endpoints `vllm-router`
probes, and KV-cache events from a running server (in process, scripted runner)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from functools import partial
from typing import Any

import httpx
import trio
from fakes import ScriptedRunner

from kv_event_helpers import replayed_events
from polling import eventually
from server_helpers import chat, completion
from sluiceway.api.fleet.routes import reachable
from sluiceway.fleet.kv_events_config import KVEventsConfig

MODEL = "test-model"
# Long enough for several full 16-token blocks once templated.
LONG = "the river flows under a quiet bridge and on " * 8


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


async def test_vllm_named_metrics_follow_the_engine(start_server: Any) -> None:
    async with start_server() as server, httpx.AsyncClient(base_url=server.url) as client:
        before = _samples((await client.get("/metrics")).text)
        label = f'{{model_name="{MODEL}"}}'
        for name in (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total",
            "vllm:prompt_tokens_total",
            "vllm:generation_tokens_total",
            "vllm:num_preemptions_total",
            "vllm:time_to_first_token_seconds_count",
            "vllm:e2e_request_latency_seconds_count",
        ):
            assert before[name + label] == 0, name
        assert (
            before[f'vllm:time_to_first_token_seconds_bucket{{le="+Inf",model_name="{MODEL}"}}']
            == 0
        )

        usages = []
        for _ in range(2):  # the second finds the first's prompt blocks cached
            r = await client.post("/v1/chat/completions", json=chat(LONG, max_tokens=3))
            usages.append(r.json()["usage"])
        after = _samples((await client.get("/metrics")).text)
        prompt = usages[0]["prompt_tokens"]
        cached = usages[1]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= 32
        assert after["vllm:prefix_cache_queries_total" + label] == 2 * prompt
        assert after["vllm:prefix_cache_hits_total" + label] == cached
        assert after["vllm:prompt_tokens_total" + label] == 2 * prompt
        assert after["vllm:generation_tokens_total" + label] == 6
        assert after["vllm:time_to_first_token_seconds_count" + label] == 2
        assert after["vllm:e2e_request_latency_seconds_count" + label] == 2
        assert after["vllm:num_requests_running" + label] == 0
        # The prompts' blocks stay cached but count as free, as in vLLM.
        assert after["vllm:kv_cache_usage_perc" + label] == 0


async def test_router_probes_are_answered(start_server: Any) -> None:
    async with start_server() as server, httpx.AsyncClient(base_url=server.url) as client:
        assert (await client.get("/get_load")).json() == {"load": 0}
        info = (await client.get("/get_server_info")).json()
        assert info["model_path"] == MODEL and info["kv_block_size"] == 16
        assert len(info["instance_id"]) == 32
        assert (await client.get("/get_model_info")).json()["model_path"] == MODEL
        assert (await client.get("/kv_event_sources")).json() == {}

        messages = [{"role": "user", "content": "hello there"}]
        tokens = (await client.post("/tokenize", json={"messages": messages})).json()["tokens"]
        # The router sends the client's body with fields of its own added.
        body = chat("hello there", stream=True, skip_special_tokens=True, separate_reasoning=True)
        rendered = (await client.post("/v1/chat/completions/render", json=body)).json()
        assert rendered["token_ids"] == tokens and rendered["model"] == MODEL
        rendered = (await client.post("/v1/completions/render", json=completion("hi there"))).json()
        plain = (await client.post("/tokenize", json={"prompt": "hi there"})).json()["tokens"]
        assert rendered["token_ids"] == plain
        wrong = await client.post("/v1/chat/completions/render", json=chat("x", model="other"))
        assert wrong.status_code == 404


def test_a_wildcard_endpoint_is_reached_at_the_callers_host() -> None:
    assert reachable("tcp://*:5557", "10.1.2.3:8000") == "tcp://10.1.2.3:5557"
    assert reachable("tcp://0.0.0.0:5557", "replica-0:8000") == "tcp://replica-0:5557"
    assert reachable("tcp://*:5557", "[::1]:8000") == "tcp://[::1]:5557"
    assert reachable("tcp://127.0.0.1:5557", "10.1.2.3:8000") == "tcp://127.0.0.1:5557"
    assert reachable(None, "h") is None


async def test_a_server_publishes_its_cached_blocks(start_server: Any) -> None:
    config = KVEventsConfig(
        enable_kv_cache_events=True,
        publisher="zmq",
        endpoint="tcp://127.0.0.1:0",
        replay_endpoint="tcp://127.0.0.1:0",
    )
    async with (
        start_server(kv_events=config) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        source = (await client.get("/kv_event_sources")).json()["0"]
        assert source["endpoint"].startswith("tcp://127.0.0.1:")
        assert source["publisher"] == "zmq" and source["enable_kv_cache_events"]
        messages = [{"role": "user", "content": LONG}]
        prompt = (await client.post("/tokenize", json={"messages": messages})).json()["tokens"]
        await client.post("/v1/chat/completions", json=chat(LONG, max_tokens=2))
        full_blocks = len(prompt) // 16
        events: list[dict[str, Any]] = []

        def stored() -> list[dict[str, Any]]:
            return [e for e in events if e["type"] == "BlockStored"]

        async def read_until(done: Callable[[], bool]) -> None:
            # The publisher's thread sends on its own schedule: poll its replay
            # buffer, bounded, as `eventually` polls the engine.
            def replayed_enough() -> bool:
                events[:] = replayed_events(source["replay_endpoint"])
                return done()

            await eventually(replayed_enough, interval=0.01, on_thread=True)

        await read_until(lambda: len(stored()) >= full_blocks)
        blocks = stored()[:full_blocks]
        assert [t for e in blocks for t in e["token_ids"]] == prompt[: full_blocks * 16]
        assert blocks[0]["parent_block_hash"] is None
        for parent, child in itertools.pairwise(blocks):
            assert child["parent_block_hash"] == parent["block_hashes"][0]
        metrics = (await client.get("/metrics")).text
        assert "sluiceway_kv_events_dropped_total 0.0" in metrics

        # The router's /flush_cache empties the cache and tells subscribers so.
        assert (await client.post("/flush_cache")).json() == {"reset": True}
        await read_until(lambda: bool(events) and events[-1]["type"] == "AllBlocksCleared")
        again = await client.post("/v1/chat/completions", json=chat(LONG, max_tokens=2))
        assert "prompt_tokens_details" not in again.json()["usage"]


async def test_the_cache_is_not_reset_under_a_running_request(
    start_server: Any, runner: ScriptedRunner
) -> None:
    runner.gated = True
    async with (
        start_server() as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        engine = server.state.engine
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                partial(client.post, "/v1/chat/completions", json=chat("hi", max_tokens=20))
            )
            await eventually(lambda: engine.stats().kv_blocks_used > 0)
            replies = []

            async def reset() -> None:
                replies.append(await client.post("/reset_prefix_cache"))

            nursery.start_soon(reset)
            # The reset waits in the loop's inbox for the step boundary.
            await eventually(lambda: engine._inbox.statistics().current_buffer_used > 0)
            runner.allow(1)
            await eventually(lambda: bool(replies))
            assert replies[0].status_code == 409 and replies[0].json() == {"reset": False}
            runner.open()
