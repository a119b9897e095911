"""The ZMQ KV-event publisher: vLLM's wire format, replay, and never blocking the
engine (a full queue drops and counts; a stalled or absent subscriber costs nothing).
Sockets are on loopback with ports picked by the OS."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq

from kv_event_helpers import replay
from polling import eventually_blocking
from sluiceway.engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from sluiceway.fleet.kv_event_publisher import KVEventPublisher
from sluiceway.fleet.kv_events_config import KVEventsConfig

STORED = BlockStored((7,), None, (1, 2, 3, 4), 4)


def _config(**kw: Any) -> KVEventsConfig:
    base: dict[str, Any] = dict(
        enable_kv_cache_events=True,
        publisher="zmq",
        endpoint="tcp://127.0.0.1:0",
        replay_endpoint="tcp://127.0.0.1:0",
    )
    return KVEventsConfig(**(base | kw))


@pytest.fixture
def publisher() -> Iterator[KVEventPublisher]:
    p = KVEventPublisher(_config())
    p.start()
    yield p
    p.close()


def test_config_parses_vllm_json_and_names_mistakes() -> None:
    config = KVEventsConfig.from_json(
        '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",'
        ' "replay_endpoint": "tcp://*:5558", "topic": "kv"}'
    )
    assert config.enabled and config.replay_endpoint == "tcp://*:5558" and config.topic == "kv"
    assert not KVEventsConfig.from_json('{"enable_kv_cache_events": true}').enabled
    for bad, message in [
        ("[1]", "object"),
        ("{", "not JSON"),
        ('{"endpoints": "x"}', "unknown keys"),
        ('{"hwm": true}', "hwm must be int"),
        ('{"publisher": "kafka"}', "publisher"),
        ('{"endpoint": "localhost:5557"}', "ZMQ address"),
        ('{"buffer_steps": 0}', "positive"),
    ]:
        with pytest.raises(ValueError, match=message):
            KVEventsConfig.from_json(bad)


def test_a_subscriber_receives_vllm_batches(publisher: KVEventPublisher) -> None:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(publisher.endpoint)
    try:
        # A new subscription takes a moment to reach the PUB socket; until then
        # messages are not delivered to it, so publish until one arrives.
        deadline = time.monotonic() + 10
        while not sub.poll(20):
            assert time.monotonic() < deadline
            publisher.record(STORED)
        topic, seq, payload = sub.recv_multipart()
        ts, events, rank = msgpack.unpackb(payload)
        assert topic == b"" and len(seq) == 8 and rank == 0 and ts > 1e9
        assert events[0] == {
            "type": "BlockStored",
            "block_hashes": [7],
            "parent_block_hash": None,
            "token_ids": [1, 2, 3, 4],
            "block_size": 4,
            "lora_id": None,
            "medium": "GPU",
            "lora_name": None,
        }
    finally:
        sub.close(linger=0)


def test_replay_resends_buffered_batches_in_order(publisher: KVEventPublisher) -> None:
    publisher.record(STORED)
    eventually_blocking(lambda: publisher.sent_batches == 1)
    publisher.record(BlockRemoved((7,)))
    eventually_blocking(lambda: publisher.sent_batches == 2)
    assert publisher.replay_endpoint is not None
    batches = replay(publisher.replay_endpoint)
    assert [seq for seq, _ in batches] == [0, 1]
    assert batches[1][1][1] == [{"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU"}]
    assert [seq for seq, _ in replay(publisher.replay_endpoint, start=1)] == [1]


def test_a_full_queue_drops_counts_and_then_clears_subscribers() -> None:
    p = KVEventPublisher(_config(max_queue_size=2))
    for _ in range(5):  # not started: nothing drains the queue, and record still returns
        p.record(STORED)
    assert p.dropped == 3
    p.start()
    try:
        eventually_blocking(lambda: p.sent_batches == 1)
        assert p.replay_endpoint is not None
        ((_, (_, events, _)),) = replay(p.replay_endpoint)
        assert [e["type"] for e in events] == ["BlockStored", "BlockStored", "AllBlocksCleared"]
    finally:
        p.close()


def test_a_subscriber_that_never_reads_costs_nothing(publisher: KVEventPublisher) -> None:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVHWM, 1)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(publisher.endpoint)
    try:
        for i in range(20_000):
            publisher.record(BlockRemoved((i,)))
        eventually_blocking(lambda: publisher._queue.empty())
        assert publisher.dropped == 0
    finally:
        sub.close(linger=0)


def test_binding_a_taken_port_fails_at_start(publisher: KVEventPublisher) -> None:
    clash = KVEventPublisher(_config(endpoint=publisher.endpoint, replay_endpoint=None))
    with pytest.raises(zmq.ZMQError):
        clash.start()
    clash.close()


def test_close_is_bounded_and_idempotent() -> None:
    p = KVEventPublisher(_config())
    p.close()  # before start
    p.start()
    p.record(AllBlocksCleared())
    p.close()
    p.close()
    assert not p._thread.is_alive()
