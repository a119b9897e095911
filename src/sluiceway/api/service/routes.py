"""Health, models, metrics, tokenizer endpoints and the OpenAPI document."""

from __future__ import annotations

from quart import Blueprint, Response, request

from sluiceway import protocol
from sluiceway.api.http.errors import invalid_request
from sluiceway.api.http.json_body import encode_json, json_response
from sluiceway.api.observability.metrics import CONTENT_TYPE
from sluiceway.api.pipeline import prompts
from sluiceway.api.pipeline.validation import check_conversation, check_token_ids
from sluiceway.api.service.openapi import openapi_document
from sluiceway.api.state import ServerState, current_state
from sluiceway.protocol import DetokenizeRequest, DetokenizeResponse, TokenizeRequest

blueprint = Blueprint("misc", __name__)


@blueprint.get("/health")
async def health() -> Response:
    """Only browser checks (with an Origin header, for CORS) get here; plain ones
    are answered by `SluicewayApp` before quart."""
    status, body = current_state().health()
    return json_response(body, status)


def _model_cards(state: ServerState) -> list[protocol.Model]:
    """The base model's card, then each LoRA adapter's, whose parent is the base
    model (as vLLM lists them)."""
    base = protocol.Model(
        id=state.model_name, created=state.created, max_model_len=state.engine.max_model_len
    )
    adapters = [
        protocol.Model(
            id=m.name,
            created=state.created,
            root=m.path,
            parent=state.model_name,
            max_model_len=state.engine.max_model_len,
        )
        for m in state.engine.lora_modules
    ]
    return [base, *adapters]


@blueprint.get("/v1/models")
async def models() -> Response:
    return json_response(protocol.ModelList(_model_cards(current_state())).to_dict())


@blueprint.get("/v1/models/<path:model>")
async def model(model: str) -> Response:
    state = current_state()
    state.check_model(model)
    card = next(c for c in _model_cards(state) if c.id == model)
    return json_response(card.to_dict())


@blueprint.get("/metrics")
async def metrics() -> Response:
    return Response(current_state().metrics.render(), content_type=CONTENT_TYPE)


@blueprint.get("/openapi.json")
async def openapi() -> Response:
    return json_response(openapi_document(current_state().model_name))


@blueprint.post("/tokenize")
async def tokenize() -> Response:
    """Token ids of a prompt or of one rendered conversation. A large body is parsed,
    rendered, tokenized and answered off the event loop (`prompts.prepare`)."""
    state = current_state()
    data = await request.get_data(cache=False)

    def prepare() -> bytes:
        req = prompts.parse_body(data, TokenizeRequest)
        state.check_model(req.model)
        tok = state.tokenizer
        if req.messages is not None:
            conversation = check_conversation(req.messages, state.engine.max_model_len, "messages")
            add_generation_prompt = req.add_generation_prompt is not False
            config = state.server_config  # rendered as a chat request would be
            template = prompts.ChatTemplate(
                config.chat_template, config.default_chat_template_kwargs
            )
            ready = prompts.chat_prompts(
                tok, [conversation], add_generation_prompt, template=template
            )
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
    time: one `json.dumps` of a million ids would hold the GIL, and so every
    stream, for as long as it takes."""
    step = 8192
    ids = ",".join(",".join(map(str, tokens[i : i + step])) for i in range(0, len(tokens), step))
    head = f'{{"count":{len(tokens)},"max_model_len":{max_model_len},"tokens":['
    return (head + ids + "]}").encode()


@blueprint.post("/detokenize")
async def detokenize() -> Response:
    state = current_state()
    data = await request.get_data(cache=False)

    def prepare() -> bytes:
        req = prompts.parse_body(data, DetokenizeRequest)
        state.check_model(req.model)
        check_token_ids(req.tokens, state.vocab_size, "tokens")
        return encode_json(DetokenizeResponse(state.tokenizer.decode(req.tokens)).to_dict()).encode()

    body = await prompts.prepare(state, len(data), prepare)
    return Response(body, content_type="application/json")
