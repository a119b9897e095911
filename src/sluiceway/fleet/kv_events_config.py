"""`--kv-events-config`: vLLM's KVEventsConfig JSON, validated into a frozen config."""

from __future__ import annotations

import json
from typing import Any, Literal

import attrs

PublisherName = Literal["null", "zmq"]


def _positive(instance: object, attribute: attrs.Attribute, value: int) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be positive, got {value}")


def _zmq_endpoint(instance: object, attribute: attrs.Attribute, value: str | None) -> None:
    if value is not None and not value.startswith(("tcp://", "ipc://", "inproc://")):
        raise ValueError(f"{attribute.name} must be a ZMQ address (tcp://HOST:PORT), got {value!r}")


@attrs.frozen(kw_only=True)
class KVEventsConfig:
    """Where and how KV-cache events are published, with vLLM's field names and
    defaults. Events are sent only with `enable_kv_cache_events` and `publisher`
    "zmq". `endpoint` is the PUB socket and `replay_endpoint` the optional ROUTER
    socket that resends the last `buffer_steps` batches on request; both are bound
    here (port 0: any free port), since routers subscribe to replicas. `hwm` is the
    PUB socket's high-water mark; `max_queue_size` bounds the events waiting for
    the sending thread (beyond it they are dropped and counted)."""

    enable_kv_cache_events: bool = False
    publisher: PublisherName = attrs.field(
        default="null", validator=attrs.validators.in_(("null", "zmq"))
    )
    endpoint: str = attrs.field(default="tcp://*:5557", validator=_zmq_endpoint)
    replay_endpoint: str | None = attrs.field(default=None, validator=_zmq_endpoint)
    buffer_steps: int = attrs.field(default=10_000, validator=_positive)
    hwm: int = attrs.field(default=100_000, validator=_positive)
    max_queue_size: int = attrs.field(default=100_000, validator=_positive)
    topic: str = ""

    @property
    def enabled(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"

    @classmethod
    def from_json(cls, text: str) -> KVEventsConfig:
        """Parse the flag's JSON object. Raises ValueError naming what is wrong: not
        JSON, not an object, an unknown key, or a value of the wrong type or range.
        vLLM's `publisher` default is "null"; naming an endpoint alone does not
        turn events on, exactly as there."""
        try:
            raw: Any = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--kv-events-config is not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ValueError("--kv-events-config must be a JSON object")
        known = {a.name for a in attrs.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"--kv-events-config: unknown keys {unknown}; known: {sorted(known)}")
        for name, value in raw.items():
            _check_type(name, value)
        return cls(**raw)


_TYPES: dict[str, tuple[type, ...]] = {
    "enable_kv_cache_events": (bool,),
    "publisher": (str,),
    "endpoint": (str,),
    "replay_endpoint": (str, type(None)),
    "buffer_steps": (int,),
    "hwm": (int,),
    "max_queue_size": (int,),
    "topic": (str,),
}


def _check_type(name: str, value: Any) -> None:
    types = _TYPES[name]
    # bool is an int in Python; a count given as true/false is a mistake.
    if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
        wanted = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        raise ValueError(f"--kv-events-config: {name} must be {wanted}, got {value!r}")


@attrs.frozen
class KVEventSource:
    """Where a running publisher can be reached: its bound PUB (and replay) address
    and the settings subscribers ask about (`GET /kv_event_sources`)."""

    endpoint: str
    replay_endpoint: str | None
    topic: str
    hwm: int
    buffer_steps: int
