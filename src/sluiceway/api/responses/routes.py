"""The Responses API: `POST /v1/responses` (streamed with named events, whole, or
in the background), `GET` and `DELETE /v1/responses/{id}`, `GET
/v1/responses/{id}/input_items`, and `POST /v1/responses/{id}/cancel` for a
background one.

Every stored response is its creator's (`owners.py`): another key gets 404 from
each of these, and from `previous_response_id`.

A response is generated as one chat choice (`response_input` turns the request
into the chat body, `response_output` the chat deltas into output items), so
admission, cancellation, timeouts and disconnects behave as on the chat
endpoint: the work runs in the request's own nursery, or for a stream in a task
of the connection's nursery, and leaving it aborts the choice in the engine.
"""

from __future__ import annotations

import logging
import time
import uuid
from functools import partial
from typing import Any

import attrs
import trio
from quart import Blueprint, Response, request

from sluiceway import protocol
from sluiceway.api.http import errors, sse
from sluiceway.api.http.errors import APIError
from sluiceway.api.http.json_body import encode_json, json_response
from sluiceway.api.http.stream_output import StreamOutput
from sluiceway.api.keys.owners import Owner, current_owner
from sluiceway.api.keys.rate_limits import budgeted_key
from sluiceway.api.pipeline import prompts
from sluiceway.api.pipeline.generation import (
    charge_and_compile,
    chat_prompts,
    run_streamed,
    run_whole,
    stream_response,
)
from sluiceway.api.pipeline.request_run import ChoiceState, RequestRun
from sluiceway.api.pipeline.shapes import ChatShape
from sluiceway.api.pipeline.validation import ValidatedChatRequest
from sluiceway.api.responses.input_items import chat_body, chat_messages, input_items
from sluiceway.api.responses.output import ResponseOutput
from sluiceway.api.responses.store import StoredResponse
from sluiceway.api.state import BackgroundRun, ServerState, current_state
from sluiceway.engine.outputs import ChoiceDelta
from sluiceway.protocol.responses import (
    INCLUDABLE,
    IncompleteDetails,
    InputTokensDetails,
    OutputTokensDetails,
    ResponseError,
    ResponseItemList,
    ResponseUsage,
)
from sluiceway.transport import access_log
from sluiceway.transport.chunk_socket import ChunkSocket
from sluiceway.transport.connection import connection_send

log = logging.getLogger(__name__)
blueprint = Blueprint("responses", __name__)

# Streamed background responses whose events are kept once they have ended.
_ENDED_STREAMS_KEPT = 128


@attrs.frozen
class _Prepared:
    request: protocol.ResponseCreateRequest
    chat: ValidatedChatRequest
    prompts: list[prompts.Prompt]
    history: tuple[dict[str, Any], ...]
    own_messages: list[dict[str, Any]]
    input_items: tuple[dict[str, Any], ...]
    # Who the response is stored for (None: no one, no keys configured).
    owner: Owner | None


@blueprint.post("/v1/responses")
async def create_response() -> Response:
    state = current_state()
    started = trio.current_time()
    state.check_accepting()
    data = await request.get_data(cache=False)
    req = await prompts.prepare(
        state, len(data), lambda: prompts.parse_body(data, protocol.ResponseCreateRequest)
    )
    if req.background and (req.store is False or state.background_nursery is None):
        raise errors.invalid_request("A background response must be stored.", "background")
    owner = current_owner()
    history: tuple[dict[str, Any], ...] = ()
    if req.previous_response_id is not None:
        history = _history(state, req.previous_response_id, owner)
    body = encode_json(chat_body(req, history)).encode("utf-8")
    chat, ready = await prompts.prepare(state, len(body), lambda: chat_prompts(state, body))
    prompts.check_lengths(state, ready, chat.params.max_tokens, "input")
    chat, charge = await charge_and_compile(state, chat, ready, budgeted_key())
    prompts.prepared()  # an idle engine need hold its first step for us no longer
    prepared = _Prepared(
        req, chat, ready, history, chat_messages(req.input), tuple(input_items(req.input)), owner
    )
    adapter = chat.model if chat.params.lora_id else None
    run = RequestRun(
        state=state, prompts=ready, n=1, started_at=started, charge=charge, adapter_name=adapter
    )
    generation = _Generation(run, prepared)
    access_log.note_generation(generation.response.id, run)
    if req.background:
        queued, running = generation.start_in_background(streamed=bool(req.stream))
        if req.stream:
            return await stream_response(partial(_follow, running, -1))
        return json_response(queued.to_dict())
    if not req.stream:
        return json_response((await generation.complete()).to_dict())
    return await stream_response(generation.stream)


def _history(
    state: ServerState, response_id: str, owner: Owner | None
) -> tuple[dict[str, Any], ...]:
    """What a response continuing `response_id` puts before its own input: that
    response's conversation, its input and whatever output it produced, also when
    it failed, was cancelled or was cut short. One still queued or in progress has
    no end to continue from yet: a 400 naming its state."""
    stored = state.response_store.get(response_id, owner=owner)
    if stored is None:
        raise errors.not_found("response", response_id, "previous_response_id")
    status = stored.response.status
    if status in ("queued", "in_progress"):
        raise errors.invalid_request(
            f"The previous response '{response_id}' is still {status}: it can be continued "
            "once it has ended (cancel it to continue from its output so far).",
            "previous_response_id",
        )
    return stored.conversation


@blueprint.get("/v1/responses/<response_id>")
async def get_response(response_id: str) -> Response:
    """The stored response; with `stream=true`, the events of a background response
    created streamed, from the one after `starting_after` (a sequence number),
    following it live while it runs."""
    state = current_state()
    stored = state.response_store.get(response_id, owner=current_owner())
    if stored is None:
        raise errors.response_not_found(response_id)
    if request.args.get("stream") != "true":
        return json_response(stored.response.to_dict())
    running = state.background_runs.get(response_id) or state.ended_streams.get(response_id)
    if running is None or running.events is None:
        raise errors.invalid_request(
            "Only a background response created with stream: true can be streamed, "
            "while this server keeps its events.",
            "stream",
        )
    try:
        after = int(request.args.get("starting_after", "-1"))
    except ValueError:
        after = -2
    if after < -1:
        raise errors.invalid_request(
            "starting_after must be a sequence number (0 or more).", "starting_after"
        )
    return await stream_response(partial(_follow, running, after))


async def _follow(
    running: BackgroundRun, after: int, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED
) -> None:
    """Streams a background response's events after `after` to the current client
    until the last; the client leaving ends only this reading, never the response."""
    out = StreamOutput(ChunkSocket.of(connection_send()))
    task_status.started(out)
    try:
        async for event in running.follow(after):
            out.put(sse.named_event(event["type"], event))
    except* (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the client is gone; the response runs on
    finally:
        out.close()


@blueprint.get("/v1/responses/<response_id>/input_items")
async def list_input_items(response_id: str) -> Response:
    """A page of the response's own input items (not those of the conversation its
    `previous_response_id` continues, as on OpenAI): `limit` of them (1-100,
    default 20), newest first unless `order=asc`, from the one after the item
    `after`. `include` takes OpenAI's values, none of which adds anything here."""
    args = request.args
    try:
        limit = int(args.get("limit", "20"))
    except ValueError:
        raise errors.invalid_request("limit must be a whole number.", "limit") from None
    if not 1 <= limit <= 100:
        raise errors.invalid_request("limit must be between 1 and 100.", "limit")
    order = args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise errors.invalid_request("order must be 'asc' or 'desc'.", "order")
    # Clients send a list as `include[]=a&include[]=b` (the openai SDK) or repeated.
    for value in args.getlist("include") + args.getlist("include[]"):
        if value not in INCLUDABLE:
            raise errors.invalid_request(
                f"include {value!r} is not one of {', '.join(sorted(INCLUDABLE))}.", "include"
            )
    stored = current_state().response_store.get(response_id, owner=current_owner())
    if stored is None:
        raise errors.response_not_found(response_id)
    items = list(stored.input_items if order == "asc" else reversed(stored.input_items))
    start = 0
    after = args.get("after")
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise errors.invalid_request(f"No input item {after!r} in this response.", "after")
        start = ids.index(after) + 1
    page = items[start : start + limit]
    return json_response(
        ResponseItemList(
            page,
            first_id=page[0]["id"] if page else None,
            last_id=page[-1]["id"] if page else None,
            has_more=start + limit < len(items),
        ).to_dict()
    )


@blueprint.post("/v1/responses/<response_id>/cancel")
async def cancel_response(response_id: str) -> Response:
    """Cancels a background response still running: its choice leaves the engine
    before this answers. A finished one is answered as it is."""
    state = current_state()
    owner = current_owner()
    stored = state.response_store.get(response_id, owner=owner)
    if stored is None:
        raise errors.response_not_found(response_id)
    if not stored.response.background:
        raise errors.invalid_request("Only a background response can be cancelled.", "response_id")
    running = state.background_runs.get(response_id)
    if running is not None:
        running.scope.cancel()
        await running.done.wait()
        stored = state.response_store.get(response_id, owner=owner) or stored
    return json_response(stored.response.to_dict())


@blueprint.delete("/v1/responses/<response_id>")
async def delete_response(response_id: str) -> Response:
    if not current_state().response_store.delete(response_id, owner=current_owner()):
        raise errors.response_not_found(response_id)
    return json_response(protocol.ResponseDeleted(response_id).to_dict())


class _Generation:
    """One response's generation: its choice's deltas fed to a `ResponseOutput`."""

    def __init__(self, run: RequestRun, prepared: _Prepared) -> None:
        self.run = run
        self.prepared = prepared
        self.shape = ChatShape(prepared.chat, run.state.token_text)
        req = prepared.request
        self.response = protocol.Response(
            id=f"resp_{uuid.uuid4().hex}",
            created_at=int(time.time()),
            model=run.served_name,
            status="in_progress",
            instructions=req.instructions,
            max_output_tokens=None if req.max_output_tokens is None else int(req.max_output_tokens),
            previous_response_id=req.previous_response_id,
            temperature=req.temperature,
            top_p=req.top_p,
            tools=req.tools or [],
            tool_choice=req.tool_choice or "auto",
            parallel_tool_calls=req.parallel_tool_calls is not False,
            text=req.text or {"format": {"type": "text"}},
            metadata=req.metadata or {},
            store=req.store is not False,
        )
        self.output = ResponseOutput()

    async def sink(self, choice: ChoiceState, delta: ChoiceDelta | None) -> None:
        if delta is not None:
            body = self.shape.delta_choice(choice, delta)
            if body is not None:
                self.output.feed(body)

    def _finished(self, failure: APIError | None) -> protocol.Response:
        """The response in its final status, stored when it asked to be."""
        run = self.run
        items = self.output.close()
        usage = ResponseUsage(
            input_tokens=run.prompt_tokens,
            output_tokens=run.completion_tokens,
            total_tokens=run.prompt_tokens + run.completion_tokens,
            input_tokens_details=InputTokensDetails(run.cached_tokens),
            output_tokens_details=OutputTokensDetails(self.shape.reasoning_tokens() or 0),
        )
        status, incomplete, error = "completed", None, None
        if failure is not None:
            status, error = "failed", ResponseError(failure.code or failure.type, failure.message)
        elif self.output.finish_reason == "length":
            status, incomplete = "incomplete", IncompleteDetails("max_output_tokens")
        final = attrs.evolve(
            self.response,
            status=status,
            output=items,
            usage=usage,
            incomplete_details=incomplete,
            error=error,
        )
        if final.store:
            self._store(final)
        return final

    def _store(self, response: protocol.Response) -> None:
        """Stores `response` in its state now, with the conversation a later
        `previous_response_id` continues: its history, its input and the output it
        has (none while queued or in progress; what it had when it failed or was
        cancelled), so that an interrupted response continues from what it said."""
        conversation = (
            *self.prepared.history,
            *self.prepared.own_messages,
            *chat_messages(response.output),
        )
        self.run.state.response_store.put(
            StoredResponse(response, conversation, self.prepared.input_items),
            owner=self.prepared.owner,
        )

    async def complete(self) -> protocol.Response:
        """The whole response; raises `APIError` as the chat endpoint does."""
        await run_whole(self.run, self.prepared.chat.params, "input", self.sink)
        return self._finished(None)

    def start_in_background(
        self, *, streamed: bool = False
    ) -> tuple[protocol.Response, BackgroundRun]:
        """Stores the response as queued and starts its generation in the server's
        background nursery; `POST /v1/responses/{id}/cancel` cancels it there.
        Returns the queued response and its run, whose events, when `streamed`,
        its readers follow (a reader leaving never stops it)."""
        state = self.run.state
        assert state.background_nursery is not None
        queued = attrs.evolve(self.response, status="queued", background=True)
        self.response = attrs.evolve(queued, status="in_progress")
        self._store(queued)
        running = state.background_runs[queued.id] = BackgroundRun(events=[] if streamed else None)
        if streamed:
            self.output = ResponseOutput(running.add_event)
            self.output.queue(queued)
        state.background_nursery.start_soon(self._run_in_background, running)
        return queued, running

    async def _run_in_background(self, running: BackgroundRun) -> None:
        state = self.run.state
        try:
            with running.scope:
                try:
                    self.output.begin(self.response)
                    self._store(self.response)  # in progress, for GET and the 400 above
                    self.output.finish(await self.complete())
                except APIError as exc:
                    error = ResponseError(exc.code or exc.type, exc.message)
                    self.output.finish(self._store_ended("failed", error))
            if running.scope.cancelled_caught:
                self._store_ended("cancelled", None)
        finally:
            self.run.settle()  # were it cancelled before the engine had it
            del state.background_runs[self.response.id]
            running.end()
            if running.events is not None:
                state.ended_streams[self.response.id] = running
                while len(state.ended_streams) > _ENDED_STREAMS_KEPT:
                    state.ended_streams.popitem(last=False)

    def _store_ended(self, status: str, error: ResponseError | None) -> protocol.Response:
        """Stores the response ended early (failed or cancelled) with the output it
        had by then."""
        ended = attrs.evolve(self.response, status=status, error=error, output=self.output.close())
        self._store(ended)
        return ended

    async def stream(self, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        """The response's named events, as `run_streamed` runs them."""
        await run_streamed(self.run, self.prepared.chat.params, "input", self, task_status)

    def start(self, output: StreamOutput) -> None:
        self.output = ResponseOutput(lambda e: output.put(sse.named_event(e["type"], e)))
        self._stream_output = output
        self.output.start(self.response)

    def finish(self) -> None:
        self.output.finish(self._finished(self.run.failure()))

    def fail(self, error: APIError) -> None:
        self._stream_output.put(sse.named_event("error", {"type": "error", **error.body()["error"]}))
