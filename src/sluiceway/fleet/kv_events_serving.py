"""Runs a KV-event publisher for the lifetime of a server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import trio
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from sluiceway.api.state import ServerState
from sluiceway.engine.engine import Engine
from sluiceway.fleet.kv_event_publisher import KVEventPublisher
from sluiceway.fleet.kv_events_config import KVEventsConfig, KVEventSource


class _DroppedCollector(Collector):
    def __init__(self, publisher: KVEventPublisher) -> None:
        self._publisher = publisher

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "sluiceway_kv_events_dropped",
            "KV-cache events dropped because the publisher's queue was full.",
            value=self._publisher.dropped,
        )


@asynccontextmanager
async def publishing_kv_events(
    engine: Engine, state: ServerState, config: KVEventsConfig | None
) -> AsyncIterator[None]:
    """While inside, the engine's block events go to a ZMQ publisher (if `config`
    enables one) and /kv_event_sources names it. Entering binds the sockets and
    raises what binding raised. Leaving, however it happens (cancellation
    included), detaches the engine and closes the publisher, waiting at most
    about a second for queued events to go out."""
    if config is None or not config.enabled:
        yield
        return
    publisher = KVEventPublisher(config)
    await trio.to_thread.run_sync(publisher.start)
    collector = _DroppedCollector(publisher)
    try:
        engine.attach_kv_event_sink(publisher.record)
        state.kv_event_source = KVEventSource(
            publisher.endpoint,
            publisher.replay_endpoint,
            config.topic,
            config.hwm,
            config.buffer_steps,
        )
        state.metrics.registry.register(collector)
        yield
    finally:
        engine.attach_kv_event_sink(None)
        state.kv_event_source = None
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(publisher.close)
