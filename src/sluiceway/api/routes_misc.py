"""Health, models, metrics, tokenizer endpoints and the OpenAPI document."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, current_app, request

from sluiceway import protocol
from sluiceway.api import errors, prompts, sse
from sluiceway.api.errors import invalid_request
from sluiceway.api.metrics import CONTENT_TYPE
from sluiceway.api.openapi import openapi_document
from sluiceway.api.state import ServerState
from sluiceway.api.validation import check_conversation, check_token_ids
from sluiceway.protocol import DetokenizeRequest, DetokenizeResponse, TokenizeRequest

blueprint = Blueprint("misc", __name__)


def _state() -> ServerState:
    return current_app.config["SLUICEWAY_STATE"]


def _json(obj: Any, status: int = 200) -> Response:
    return Response(sse.dumps(obj), status=status, content_type="application/json")


@blueprint.get("/health")
async def health() -> Response:
    """Only browser checks (with an Origin header, for CORS) get here; plain ones
    are answered by `SluicewayApp` before quart."""
    status, body = _state().health()
    return _json(body, status)


def _model_card(state: ServerState) -> protocol.Model:
    return protocol.Model(
        id=state.model_name, created=state.created, max_model_len=state.engine.max_model_len
    )


@blueprint.get("/v1/models")
async def models() -> Response:
    return _json(protocol.ModelList([_model_card(_state())]).to_dict())


@blueprint.get("/v1/models/<path:model>")
async def model(model: str) -> Response:
    state = _state()
    if model != state.model_name:
        raise errors.model_not_found(model)
    return _json(_model_card(state).to_dict())


@blueprint.get("/metrics")
async def metrics() -> Response:
    return Response(_state().metrics.render(), content_type=CONTENT_TYPE)


@blueprint.get("/openapi.json")
async def openapi() -> Response:
    return _json(openapi_document(_state().model_name))


def _check_model(state: ServerState, name: str | None) -> None:
    if name is not None and name != state.model_name:
        raise errors.model_not_found(name)


@blueprint.post("/tokenize")
async def tokenize() -> Response:
    """Token ids of a prompt or of one rendered conversation. A large body is parsed,
    rendered, tokenized and answered off the event loop (`prompts.prepare`)."""
    state = _state()
    data = await request.get_data(cache=False)

    def prepare() -> bytes:
        req = prompts.parse_body(data, TokenizeRequest)
        _check_model(state, req.model)
        tok = state.tokenizer
        if req.messages is not None:
            conversation = check_conversation(req.messages, state.engine.max_model_len, "messages")
            add_generation_prompt = req.add_generation_prompt is not False
            ready = prompts.chat_prompts(tok, [conversation], add_generation_prompt)
        elif req.prompt is not None:
            add_special = req.add_special_tokens is not False
            ready = prompts.text_prompt(tok, req.prompt, add_special)
        else:
            raise invalid_request("Give 'prompt' (a string) or 'messages'.", "prompt")
        prompts.check_cancelled()
        return _tokens_body(ready[0].token_ids, state.engine.max_model_len)

    body = await prompts.prepare(state, len(data), prepare)
    return Response(body, content_type="application/json")


def _tokens_body(tokens: tuple[int, ...], max_model_len: int) -> bytes:
    """`{"count", "max_model_len", "tokens"}` as JSON, the ids joined a slice at a
    time: one `json.dumps` of a million ids holds the GIL for over 100 ms."""
    step = 8192
    ids = ",".join(",".join(map(str, tokens[i : i + step])) for i in range(0, len(tokens), step))
    head = f'{{"count":{len(tokens)},"max_model_len":{max_model_len},"tokens":['
    return (head + ids + "]}").encode()


@blueprint.post("/detokenize")
async def detokenize() -> Response:
    state = _state()
    data = await request.get_data(cache=False)

    def prepare() -> bytes:
        req = prompts.parse_body(data, DetokenizeRequest)
        _check_model(state, req.model)
        check_token_ids(req.tokens, state.vocab_size, "tokens")
        return sse.dumps(DetokenizeResponse(state.tokenizer.decode(req.tokens)).to_dict()).encode()

    body = await prompts.prepare(state, len(data), prepare)
    return Response(body, content_type="application/json")
