"""`POST /v1/embeddings`: each input is one prefill-only sequence in the engine
(`Engine.embed`), all of a request's inputs in one fair share and batched with
whatever else is running. The vectors are the model's pooled hidden states, cut
to `dimensions` and L2-normalized, as OpenAI returns them.

The inputs run in the request's own nursery under its deadline and the drain
scope; leaving it for any reason (a disconnect, the timeout, the first input
the engine refuses) aborts every input still in the engine.
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Sequence
from functools import partial
from typing import Any

import trio
from quart import Blueprint, Response, request

from sluiceway.api.http import errors
from sluiceway.api.http.errors import APIError
from sluiceway.api.http.json_body import json_response
from sluiceway.api.keys.rate_limits import TokenCharge, budgeted_key, hold_tokens
from sluiceway.api.pipeline import prompts
from sluiceway.api.pipeline.prompts import Prompt
from sluiceway.api.pipeline.validation import check_token_ids, prompt_list
from sluiceway.api.state import ServerState, current_state
from sluiceway.engine.errors import EngineUnhealthyError, QueueFullError
from sluiceway.engine.pooling import PoolingSpec
from sluiceway.protocol.embeddings import (
    MAX_EMBEDDING_INPUTS,
    Embedding,
    EmbeddingList,
    EmbeddingRequest,
    EmbeddingUsage,
)

blueprint = Blueprint("embeddings", __name__)


@blueprint.post("/v1/embeddings")
async def create_embeddings() -> Response:
    state = current_state()
    started = trio.current_time()
    state.check_accepting()
    data = await request.get_data(cache=False)
    body = await _embeddings(state, data, started, budgeted_key(), background=False)
    return json_response(body)


async def embed_in_background(
    state: ServerState, data: bytes, key: str | None = None
) -> dict[str, Any]:
    """The answer to an embeddings body, its inputs at background priority: a Batch
    API line, charged to `key`'s budget (waiting until it has the tokens). Raises
    `APIError` as the endpoint answers it; cancellation aborts it."""
    started = trio.current_time()
    state.check_accepting()
    return await _embeddings(state, data, started, key, background=True)


async def _embeddings(
    state: ServerState, data: bytes | str, started: float, key: str | None, *, background: bool
) -> dict[str, Any]:
    spec = state.engine.pooling
    if spec is None:
        raise errors.invalid_request(
            f"The model {state.model_name} is not served for embeddings here.", "model"
        )
    req, ready = await prompts.prepare(state, len(data), partial(_inputs, state, spec, data))
    tokens = sum(len(p.token_ids) for p in ready)
    charge = await hold_tokens(
        state.rate_limits, key, tokens, model=state.model_name, wait=background
    )
    prompts.prepared()  # an idle engine need hold its first step for us no longer
    lora_id = state.check_model(req.model)  # checked in `_inputs` already
    pooled = await _embed(state, ready, started, background, charge, lora_id)
    dimensions = req.dimensions or spec.hidden_size
    base64_floats = req.encoding_format == "base64"
    data_out = [
        Embedding(i, _encoded(_normalized(vector[:dimensions]), base64_floats))
        for i, vector in enumerate(pooled)
    ]
    model = (req.model if lora_id else None) or state.model_name
    return EmbeddingList(data_out, model, EmbeddingUsage(tokens, tokens)).to_dict()


def _inputs(
    state: ServerState, spec: PoolingSpec, data: bytes | str
) -> tuple[EmbeddingRequest, list[Prompt]]:
    """The body validated and its inputs tokenized (run by `prompts.prepare`).
    Raises `APIError`: 400 for a bad body, a width the model does not allow, an
    empty input or one longer than the context; 404 for another model's name."""
    req = prompts.parse_body(data, EmbeddingRequest)
    state.check_model(req.model)
    if req.dimensions is not None and not spec.allows_dimensions(req.dimensions):
        raise errors.invalid_request(
            f"This model's embeddings cannot be cut to {req.dimensions} dimensions: it "
            f"allows {_widths(spec)}.",
            "dimensions",
        )
    # Each input is one sequence in the engine, so it counts as a choice does.
    max_inputs = min(MAX_EMBEDDING_INPUTS, state.server_config.max_choices_per_request)
    inputs = prompt_list(req.input, "input", max_inputs)
    for item in inputs:
        if not isinstance(item, str):
            check_token_ids(item, state.vocab_size, "input")
    ready = prompts.completion_prompts(state.tokenizer, inputs, echo=False)
    limit = state.engine.max_model_len
    for i, prompt in enumerate(ready):
        if not prompt.token_ids:
            raise errors.invalid_request(f"Input {i} is empty (no tokens).", "input")
        if len(prompt.token_ids) > limit:
            raise APIError(
                400,
                f"This model's maximum context length is {limit} tokens; input {i} has "
                f"{len(prompt.token_ids)} tokens.",
                "invalid_request_error",
                "input",
                "context_length_exceeded",
            )
    return req, ready


def _widths(spec: PoolingSpec) -> str:
    if spec.matryoshka_dimensions is None:
        return f"only its full width, {spec.hidden_size}"
    if not spec.matryoshka_dimensions:
        return f"any width up to {spec.hidden_size}"
    return f"the widths {', '.join(map(str, spec.matryoshka_dimensions))} and {spec.hidden_size}"


async def _embed(
    state: ServerState,
    ready: Sequence[Prompt],
    started: float,
    background: bool,
    charge: TokenCharge,
    lora_id: int = 0,
) -> list[tuple[float, ...]]:
    """Every input's pooled vector, in input order. Raises the `APIError` of the
    first input the engine refused or failed (429 queue full, 503; the `charge`
    then given back), or of the request's end (504 timeout, 503 drained); the
    other inputs are aborted."""
    engine = state.engine
    group = object()  # the inputs of one request share one fair turn
    vectors: list[tuple[float, ...] | None] = [None] * len(ready)
    failure: list[APIError] = []

    async def embed_one(index: int, prompt: Prompt, cancel: trio.CancelScope) -> None:
        try:
            delta = await engine.embed(
                prompt.token_ids, group=group, background=background, lora_id=lora_id
            )
        except QueueFullError:
            failure.append(errors.queue_full())
        except EngineUnhealthyError:
            failure.append(state.unavailable_error())
        else:
            vectors[index] = delta.embedding
            return
        cancel.cancel()

    # A batch line waits for the foreground by design: no request timeout for it.
    deadline = trio.CancelScope(
        deadline=math.inf if background else state.request_deadline_from(started)
    )
    with state.track() as drain_scope, drain_scope, deadline:
        async with trio.open_nursery() as nursery:
            for index, prompt in enumerate(ready):
                nursery.start_soon(embed_one, index, prompt, nursery.cancel_scope)
    if failure:
        # Nothing to pay for: the engine would not take it (a batch line asks again).
        charge.settle(0)
        raise failure[0]
    if deadline.cancelled_caught:
        raise errors.timeout(state.server_config.request_timeout)
    if drain_scope.cancelled_caught:
        raise errors.draining()
    return [v for v in vectors if v is not None]


def _normalized(vector: Sequence[float]) -> list[float]:
    """`vector` scaled to unit length (as OpenAI's are; a zero vector stays zero)."""
    norm = math.sqrt(math.fsum(v * v for v in vector))
    return [v / norm for v in vector] if norm > 0 else list(vector)


def _encoded(vector: list[float], base64_floats: bool) -> list[float] | str:
    """The vector as JSON numbers, or as the base64 of its little-endian float32 bytes."""
    if not base64_floats:
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
