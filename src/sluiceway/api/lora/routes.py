"""`POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter`, with vLLM's
bodies (`{"lora_name", "lora_path"}`, `{"lora_name"}`) and plain-text answers,
served only with `--enable-lora-runtime-updates` (otherwise a 404 saying so).

A loaded adapter (a PEFT directory, or its hub id, fetched into the hub cache)
is read and checked against the base model first (off the event loop), so a
bad one is a 400 naming its problem. An unloaded adapter's name is
gone at once: new requests naming it get the unknown model's 404, and it leaves
/v1/models; requests already running through it finish under it.
"""

from __future__ import annotations

import json
from typing import Any

import trio
from quart import Blueprint, Response, request

from sluiceway.api.http.errors import APIError, invalid_request
from sluiceway.api.state import ServerState, current_state

blueprint = Blueprint("lora", __name__)


def _body(data: bytes | str, fields: tuple[str, ...]) -> dict[str, str]:
    try:
        body: Any = json.loads(data or b"{}")
    except ValueError:
        raise invalid_request("The body is not JSON.") from None
    if not isinstance(body, dict):
        raise invalid_request("The body is not a JSON object.")
    for field in fields:
        value = body.get(field)
        if not isinstance(value, str) or not value:
            raise invalid_request(f"'{field}' (a non-empty string) is required.", field)
    return {f: body[f] for f in fields}


def _updates_on(state: ServerState) -> None:
    if state.engine.lora_check is None:
        raise APIError(
            404,
            "LoRA adapters are fixed at start; serve with --enable-lora-runtime-updates "
            "to load and unload them.",
            "invalid_request_error",
            None,
            "not_found",
        )


@blueprint.post("/v1/load_lora_adapter")
async def load_lora_adapter() -> Response:
    state = current_state()
    _updates_on(state)
    body = _body(await request.get_data(cache=False), ("lora_name", "lora_path"))
    name, path = body["lora_name"], body["lora_path"]
    modules = state.engine.lora_modules
    if name == state.model_name or modules.named(name) is not None:
        raise invalid_request(f"The lora adapter '{name}' has already been loaded.", "lora_name")
    check = state.engine.lora_check
    assert check is not None
    try:  # a hub id is fetched first; the adapter's local directory is served
        path = await trio.to_thread.run_sync(check, name, path)
    except ValueError as exc:  # AdapterError: what is wrong with it
        raise invalid_request(str(exc), "lora_path") from None
    if modules.named(name) is not None:  # loaded by another request meanwhile
        raise invalid_request(f"The lora adapter '{name}' has already been loaded.", "lora_name")
    modules.add(name, path)
    return Response(f"Success: LoRA adapter '{name}' added successfully.", content_type="text/plain")


@blueprint.post("/v1/unload_lora_adapter")
async def unload_lora_adapter() -> Response:
    state = current_state()
    _updates_on(state)
    name = _body(await request.get_data(cache=False), ("lora_name",))["lora_name"]
    if state.engine.lora_modules.named(name) is None:
        raise APIError(
            404,
            f"The lora adapter '{name}' cannot be found.",
            "invalid_request_error",
            "lora_name",
            "not_found",
        )
    state.engine.lora_modules.remove(name)
    return Response(
        f"Success: LoRA adapter '{name}' removed successfully.", content_type="text/plain"
    )
