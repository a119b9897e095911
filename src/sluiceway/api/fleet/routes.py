"""What `vllm-router` asks of a worker besides generation and /health.

- `GET /get_load`: `{"load": N}`, the choices running or waiting (load-aware policies).
- `GET /get_server_info`: the model, this process's instance id and the KV block
  size: the identity a router keys its cache index by (kv_aware).
- `GET /kv_event_sources`: where this replica publishes KV-cache events, by
  data-parallel rank (`{}` when it does not), so a router subscribes without
  being told each replica's address.
- `POST /v1/chat/completions/render`, `POST /v1/completions/render`: the prompt
  token ids a request would run (vLLM's GenerateRequest shape), so a router can
  hash the prompt exactly as this server will, with no tokenizer of its own.
- `GET /get_model_info`: the served model (the router proxies it to a worker).
- `POST /flush_cache` (the router's `/flush_cache` calls it on every worker) and
  `POST /reset_prefix_cache` (vLLM's name): forget every cached prefix, if no
  request holds KV blocks; `{"reset": true}`, or 409 with `{"reset": false}`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from quart import Blueprint, Response, request

from sluiceway.api.http.json_body import json_response
from sluiceway.api.pipeline import prompts
from sluiceway.api.pipeline.generation import chat_prompts, completion_prompts
from sluiceway.api.state import ServerState, current_state
from sluiceway.fleet.kv_events_config import KVEventSource

blueprint = Blueprint("fleet", __name__)

_WILDCARD_HOSTS = frozenset({"*", "0.0.0.0", "::", "[::]"})


@blueprint.get("/get_load")
async def get_load() -> Response:
    stats = current_state().engine.stats()
    return json_response({"load": stats.num_running_seqs + stats.num_waiting_seqs})


@blueprint.get("/get_server_info")
async def get_server_info() -> Response:
    state = current_state()
    block_size = state.engine.block_size
    return json_response(
        {
            "model_path": state.model_name,
            "served_model_name": state.model_name,
            "instance_id": state.instance_id,
            "kv_block_size": block_size,
            "effective_attention_block_size": block_size,
            "max_model_len": state.engine.max_model_len,
        }
    )


@blueprint.get("/get_model_info")
async def get_model_info() -> Response:
    name = current_state().model_name
    return json_response({"model_path": name, "tokenizer_path": name, "is_generation": True})


@blueprint.post("/flush_cache")
@blueprint.post("/reset_prefix_cache")
async def reset_prefix_cache() -> Response:
    done = await current_state().engine.reset_prefix_cache()
    return json_response({"reset": done}, 200 if done else 409)


@blueprint.get("/kv_event_sources")
async def kv_event_sources() -> Response:
    source = current_state().kv_event_source
    if source is None:
        return json_response({})
    return json_response({"0": _source_entry(source, request.host)})


def _source_entry(source: KVEventSource, host: str) -> dict[str, Any]:
    """A publisher bound to every interface is reached at the host the caller used
    to reach this server (a pod's IP behind Kubernetes discovery)."""
    return {
        "endpoint": reachable(source.endpoint, host),
        "replay_endpoint": reachable(source.replay_endpoint, host),
        "topic": source.topic,
        "hwm": source.hwm,
        "buffer_steps": source.buffer_steps,
        "publisher": "zmq",
        "encoding": "msgpack",
        "schema_version": 1,
        "enable_kv_cache_events": True,
    }


def reachable(endpoint: str | None, http_host: str) -> str | None:
    """`endpoint` with a wildcard host replaced by the host part of `http_host`
    (a Host header: "10.0.0.7:8000", "[::1]:8000"); other endpoints unchanged."""
    if endpoint is None or not endpoint.startswith("tcp://"):
        return endpoint
    host, sep, port = endpoint.removeprefix("tcp://").rpartition(":")
    if not sep or host not in _WILDCARD_HOSTS:
        return endpoint
    caller = urlsplit("//" + http_host).hostname or "127.0.0.1"
    if ":" in caller:
        caller = f"[{caller}]"
    return f"tcp://{caller}:{port}"


@blueprint.post("/v1/chat/completions/render")
async def render_chat() -> Response:
    return await _render(chat_prompts)


@blueprint.post("/v1/completions/render")
async def render_completion() -> Response:
    return await _render(completion_prompts)


async def _render(
    parse: Callable[[ServerState, bytes | str], tuple[Any, list[prompts.Prompt]]],
) -> Response:
    """The body parsed and tokenized exactly as the generation route does, answered
    as vLLM's GenerateRequest for the first prompt (a chat request has one; a
    router routes a request of several prompts by its first)."""
    state = current_state()
    data = await request.get_data(cache=False)
    req, ready = await prompts.prepare(state, len(data), partial(parse, state, data))
    return json_response(
        {
            "request_id": uuid.uuid4().hex,
            "token_ids": list(ready[0].token_ids),
            "model": req.model or state.model_name,
            "sampling_params": {},
            "stream": False,
        }
    )
