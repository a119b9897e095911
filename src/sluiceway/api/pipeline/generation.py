"""A generation request end to end, streamed or whole: the pipeline every surface
calls. `generate` parses, admits and answers an HTTP request; `answer_in_background`
does the same for a body with no client (a Batch API line).

A streaming request's work runs in a task started in the HTTP connection's own
nursery (quart-trio cancels that nursery when the client disconnects), so the
engine context, the consumers and every cancel scope live in one task and are
entered and left in order. The consumers' events go out through a `StreamOutput`:
straight to the socket when nothing is queued, else through the response body.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from functools import partial
from typing import Any, Protocol, TypeVar

import attrs
import trio
from quart import Response, request

from sluiceway import protocol
from sluiceway.api.http import errors, sse
from sluiceway.api.http.errors import APIError
from sluiceway.api.http.json_body import json_response
from sluiceway.api.http.stream_output import StreamOutput
from sluiceway.api.keys.rate_limits import (
    TokenCharge,
    budgeted_key,
    generation_estimate,
    hold_tokens,
)
from sluiceway.api.pipeline import formatting as fmt
from sluiceway.api.pipeline import prompts, structured
from sluiceway.api.pipeline.prompts import Prompt
from sluiceway.api.pipeline.request_run import ChoiceState, RequestRun, Sink, admit, run_choices
from sluiceway.api.pipeline.shapes import (
    ChunkChoice,
    Shape,
    full_response,
)
from sluiceway.api.pipeline.validation import (
    ReasoningSetup,
    ValidatedChatRequest,
    ValidatedCompletionRequest,
    ValidatedRequest,
    chat_request,
    completion_request,
)
from sluiceway.api.state import ServerState, current_state
from sluiceway.engine.constraint import Grammar
from sluiceway.engine.outputs import ChoiceDelta
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.grammar.thinking import ThinkingGrammar
from sluiceway.transport import access_log
from sluiceway.transport.chunk_socket import ChunkSocket
from sluiceway.transport.connection import connection_nursery, connection_send

log = logging.getLogger(__name__)
R = TypeVar("R", bound=ValidatedRequest)


def chat_prompts(state: ServerState, data: bytes | str) -> tuple[ValidatedChatRequest, list[Prompt]]:
    """A chat body validated, its conversations rendered and tokenized (run by
    `prompts.prepare`). Raises `APIError` for a bad body or another model's name."""
    return chat_wire_prompts(state, prompts.parse_body(data, protocol.ChatCompletionRequest))


def chat_wire_prompts(
    state: ServerState, wire: protocol.ChatCompletionRequest
) -> tuple[ValidatedChatRequest, list[Prompt]]:
    """A decoded chat request validated, its conversations rendered with the
    server's template and kwargs and tokenized, and, for a reasoning model, where
    each prompt leaves the thinking. Raises `APIError`."""
    req = chat_request(
        wire,
        state.vocab_size,
        max_choices=state.server_config.max_choices_per_request,
        max_messages=state.engine.max_model_len,
    )
    req = with_adapter(req, state.check_model(req.model))
    tok = state.tokenizer
    tools = req.tool_use.tools if req.tool_use is not None else ()
    config = state.server_config
    template = prompts.ChatTemplate(
        config.chat_template, {**config.default_chat_template_kwargs, **req.template_kwargs}
    )
    ready = prompts.chat_prompts(tok, req.conversations, req.add_generation_prompt, tools, template)
    if state.reasoning is not None:
        states = tuple(state.reasoning.prompt_state(p.text) for p in ready)
        req = attrs.evolve(req, reasoning=ReasoningSetup(state.reasoning, states))
    return req, ready


def completion_prompts(
    state: ServerState, data: bytes | str
) -> tuple[ValidatedCompletionRequest, list[Prompt]]:
    """A completions body validated and its prompts tokenized (run by
    `prompts.prepare`). Raises `APIError` for a bad body or another model's name."""
    req = completion_request(
        prompts.parse_body(data, protocol.CompletionRequest),
        state.vocab_size,
        max_choices=state.server_config.max_choices_per_request,
    )
    req = with_adapter(req, state.check_model(req.model))
    return req, prompts.completion_prompts(state.tokenizer, req.prompts, req.echo)


def with_adapter(req: R, lora_id: int) -> R:
    """`req` generating through LoRA adapter `lora_id` (0: the base model)."""
    if not lora_id:
        return req
    return attrs.evolve(req, params=attrs.evolve(req.params, lora_id=lora_id))


Parse = Callable[[ServerState, bytes | str], tuple[R, list[Prompt]]]
MakeShape = Callable[[R, fmt.TokenText], Shape]


async def generate(parse: Parse[R], shape: MakeShape[R], param: str) -> Response:
    """The current HTTP request answered end to end: 503 while draining, the body
    parsed and tokenized (`parse`), lengths checked against `param` (the body field
    an error names), the key charged, the grammar compiled, then the response in
    `shape`, whole or streamed as the request asks. Raises `APIError` for what the
    client gets as an error status; a client that disconnects cancels the work,
    which leaves the engine before this returns or the stream ends."""
    state = current_state()
    started = trio.current_time()
    state.check_accepting()
    data = await request.get_data(cache=False)
    req, ready, charge = await _prepare(state, data, parse, param, budgeted_key())
    run = RequestRun(
        state=state,
        prompts=ready,
        n=req.n,
        started_at=started,
        charge=charge,
        adapter_name=req.model if req.params.lora_id else None,
    )
    try:
        return await _respond(run, req, shape(req, state.token_text), param)
    except BaseException:
        run.settle()  # not yet settled where it ended before the engine had it
        raise


async def _prepare(
    state: ServerState,
    data: bytes | str,
    parse: Parse[R],
    param: str,
    key: str | None,
    *,
    background: bool = False,
) -> tuple[R, list[Prompt], TokenCharge]:
    """The body parsed and tokenized, lengths checked against `param`, then
    `charge_and_compile`d: ready for the engine. Raises `APIError`."""
    req, ready = await prompts.prepare(state, len(data), partial(parse, state, data))
    prompts.check_lengths(state, ready, req.params.max_tokens, param)
    req, charge = await charge_and_compile(state, req, ready, key, background=background)
    prompts.prepared()  # an idle engine need hold its first step for us no longer
    return req, ready, charge


async def charge_and_compile(
    state: ServerState, req: R, ready: list[Prompt], key: str | None, *, background: bool = False
) -> tuple[R, TokenCharge]:
    """`key`'s budget charged what `req` on `ready` may cost (`background`: waiting
    for it rather than refusing), then `req` with its grammar compiled. The run
    settles the charge when it ends; a request that fails here pays nothing.
    Raises `APIError`."""
    estimate = generation_estimate(
        (len(p.token_ids) for p in ready), req.params.max_tokens, req.n, state.engine.max_model_len
    )
    charge = await hold_tokens(
        state.rate_limits, key, estimate, model=state.model_name, wait=background
    )
    try:
        return await with_grammar(state, req), charge
    except BaseException:
        charge.settle(0)
        raise


async def answer_in_background(
    state: ServerState,
    data: bytes,
    parse: Parse[R],
    shape: MakeShape[R],
    param: str,
    key: str | None = None,
) -> dict[str, Any]:
    """The whole (never streamed) response to `data`, parsed by `parse` and shaped by
    `shape`, generated at background priority: a Batch API line, charged to `key`'s
    budget (waiting until it has the tokens). Raises `APIError` as the endpoint
    answers it (a line may not ask to stream: 400); cancellation aborts it."""
    started = trio.current_time()
    state.check_accepting()
    return await _answer(state, data, parse, shape, param, started, key)


async def _answer(
    state: ServerState,
    data: bytes,
    parse: Parse[R],
    shape: MakeShape[R],
    param: str,
    started: float,
    key: str | None,
) -> dict[str, Any]:
    req, ready, charge = await _prepare(state, data, parse, param, key, background=True)
    run = RequestRun(
        state=state,
        prompts=ready,
        n=req.n,
        started_at=started,
        background=True,
        charge=charge,
        adapter_name=req.model if req.params.lora_id else None,
    )
    try:
        if req.stream:
            raise errors.invalid_request("A batch line cannot be streamed.", "stream")
        made = shape(req, state.token_text)
        request_id = f"{made.id_prefix}{uuid.uuid4().hex}"
        return await _complete(run, req, made, param, request_id, int(time.time()))
    finally:
        run.settle()  # not yet settled where it ended before the engine had it


async def with_grammar(state: ServerState, req: R) -> R:
    """`req` with its grammar compiled into its sampling params (see `structured`);
    for a reasoning model, the grammar starts after the thinking, which a budget
    may cut short (see `grammar.thinking`)."""
    setup = req.reasoning if isinstance(req, ValidatedChatRequest) else None
    budget = req.reasoning_budget if isinstance(req, ValidatedChatRequest) else None
    if req.grammar is None and (setup is None or budget is None):
        return req
    compiled = None
    if req.grammar is not None:
        param = req.grammar_param or "response_format"
        compiled = await structured.compile_grammar(state.grammar_compiler, req.grammar, param)
    grammar: Grammar | None = compiled
    if setup is not None:
        # One grammar serves every prompt of the request: they share a template
        # and its kwargs, so they leave the thinking alike (the first one's).
        tokens = await trio.to_thread.run_sync(state.thinking_tokens)
        grammar = ThinkingGrammar(tokens, setup.states[0], compiled, budget)
    return attrs.evolve(req, params=attrs.evolve(req.params, grammar=grammar))


async def _respond(run: RequestRun, req: ValidatedRequest, shape: Shape, param: str) -> Response:
    request_id = f"{shape.id_prefix}{uuid.uuid4().hex}"
    access_log.note_generation(request_id, run)
    created = int(time.time())
    if not req.stream:
        body = await _complete(run, req, shape, param, request_id, created)
        return json_response(body)
    return await stream_response(_Stream(run, req, shape, param, request_id, created).run)


async def stream_response(
    run_stream: Callable[..., Awaitable[None]],
) -> Response:
    """The streamed response of `run_stream`, started as a task in the connection's
    nursery: it reports through `task_status` either an `APIError` (admission
    failed: raised here, so the client gets its status code) or the
    `StreamOutput` the response body reads."""
    result = await connection_nursery().start(run_stream)
    if isinstance(result, APIError):
        raise result
    response = Response(result.body(), headers=sse.HEADERS)
    response.timeout = None  # a long stream is not a stuck one; our own deadline governs
    return response


async def _complete(
    run: RequestRun, req: ValidatedRequest, shape: Shape, param: str, request_id: str, created: int
) -> dict[str, Any]:
    async def collect(choice: ChoiceState, delta: ChoiceDelta | None) -> None:
        if delta is not None:
            choice.text_parts.append(delta.text)
            choice.part_tokens.append(len(delta.token_ids))
            choice.logprobs.extend(delta.logprobs)

    await run_whole(run, req.params, param, collect)
    return full_response(shape, run, request_id, created)


async def run_whole(run: RequestRun, params: SamplingParams, param: str, sink: Sink) -> None:
    """Admit `run`'s prompts with `params` and feed every choice's deltas to `sink`
    until each has ended. Raises `APIError`: the engine's refusal at admission
    (naming `param`), or what ended the run early (an engine failure, the request
    timeout, a drain's end). Cancellation (the client gone) aborts every choice in
    the engine before it propagates."""
    try:
        with run.state.track() as drain_scope:
            run.drain_scope = drain_scope
            async with AsyncExitStack() as stack:
                channels = await admit(run, stack, params, param)
                with drain_scope:
                    await run_choices(run, channels, sink)
    finally:
        run.state.metrics.e2e.observe(trio.current_time() - run.started_at)
    failure = run.failure()
    if failure is not None:
        raise failure


class StreamWriter(Protocol):
    """A surface's side of a stream (`run_streamed`): it writes its own events into
    the `StreamOutput` it is given, from each choice's deltas."""

    def start(self, output: StreamOutput) -> None:
        """The request was admitted: the stream opens on `output`."""

    async def sink(self, choice: ChoiceState, delta: ChoiceDelta | None) -> None:
        """A choice opened (`delta` None) or moved on."""

    def finish(self) -> None:
        """Every choice has ended, or the run was cut (`RequestRun.failure`)."""

    def fail(self, error: APIError) -> None:
        """A bug of ours ended the stream: say so in the surface's own error event."""


async def run_streamed(
    run: RequestRun,
    params: SamplingParams,
    param: str,
    writer: StreamWriter,
    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Admit `run`, then stream it through `writer`; run as a task in the
    connection's nursery (`stream_response`). Reports through `task_status` either
    the `APIError` of a refused admission (so the client still gets its status
    code) or the `StreamOutput` the response body reads. Ends quietly when
    cancelled (the client gone: every choice is aborted in the engine) or when the
    reader has gone away; closes the output however it ends."""
    with run.state.track() as drain_scope:
        run.drain_scope = drain_scope
        async with AsyncExitStack() as stack:
            try:
                channels = await admit(run, stack, params, param)
            except APIError as exc:
                task_status.started(exc)
                return
            # Its queue is unbounded, yet bounded by the request's own max_tokens:
            # the consumers never wait on the socket, so the engine work ends (and
            # its KV blocks are freed) as soon as generation does, however slow
            # the reader.
            output = StreamOutput(ChunkSocket.of(connection_send()))
            task_status.started(output)
            try:
                writer.start(output)
                with drain_scope:
                    await run_choices(run, channels, writer.sink)
                writer.finish()
            except* (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the response body was closed: the client is gone
            except* Exception:
                # A bug of ours, not the client's: say so in-stream rather than cut it.
                log.exception(
                    "streaming request failed request_id=%s", access_log.current_request_id()
                )
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    writer.fail(APIError(500, "Internal server error.", "internal_server_error"))
            finally:
                output.close()
                run.state.metrics.e2e.observe(trio.current_time() - run.started_at)


class _Stream:
    """One streaming request's work, run as a task in the connection's nursery."""

    def __init__(
        self,
        run: RequestRun,
        req: ValidatedRequest,
        shape: Shape,
        param: str,
        request_id: str,
        created: int,
    ) -> None:
        self.run_state = run
        self.req = req
        self.shape = shape
        self.param = param
        self.request_id = request_id
        self.created = created
        self.output: StreamOutput | None = None
        # Per choice index, the event of a chunk that carries only text, encoded once
        # (None where it could not be). Not with continuous usage stats: each chunk's
        # usage differs.
        self._text_events: dict[int, sse.EventTemplate | None] | None = (
            None if req.stream_options.continuous_usage_stats else {}
        )

    async def run(self, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        """The stream, as `run_streamed` runs it."""
        await run_streamed(self.run_state, self.req.params, self.param, self, task_status)

    def start(self, output: StreamOutput) -> None:
        self.output = output

    def fail(self, error: APIError) -> None:
        assert self.output is not None
        self._emit(error.body())
        self.output.put(sse.DONE)

    def _emit(self, obj: Any) -> None:
        assert self.output is not None
        self.output.put(sse.event(obj))

    def _chunk(self, choice: ChoiceState, body: ChunkChoice) -> None:
        self._emit(self._chunk_object(choice, body))

    def _chunk_object(self, choice: ChoiceState, body: ChunkChoice) -> dict[str, Any]:
        """The chunk of `body` as its protocol type writes it: usage as the stream
        options ask (per chunk, null until the usage chunk, or left out)."""
        opts = self.req.stream_options
        usage = None
        if opts.continuous_usage_stats:
            usage = fmt.usage(len(choice.prompt.token_ids), choice.num_output_tokens)
        return self.shape.chunk_type(
            id=self.request_id,
            model=self.run_state.served_name,
            choices=[body],  # type: ignore[list-item]
            created=self.created,
            usage=usage,
            usage_null=usage is None and opts.include_usage,
        ).to_dict()

    def _text_event(self, choice: ChoiceState, text: str) -> bytes:
        """The event of a chunk of `choice` that carries only `text`: what `_chunk`
        would emit for `shape.text_choice(choice.index, text)`."""
        assert self._text_events is not None
        index = choice.index
        if index in self._text_events:
            template = self._text_events[index]
        else:
            template = self._text_events[index] = sse.EventTemplate.around(
                lambda hole: self._chunk_object(choice, self.shape.text_choice(index, hole))
            )
        if template is None:
            return sse.event(self._chunk_object(choice, self.shape.text_choice(index, text)))
        return template.render(text)

    async def sink(self, choice: ChoiceState, delta: ChoiceDelta | None) -> None:
        if delta is not None and self._text_events is not None:
            text = self.shape.text_only_delta(choice, delta)
            if text is not None:  # most tokens: a chunk with text and nothing else
                assert self.output is not None
                self.output.put(self._text_event(choice, text))
                return
        body = (
            self.shape.open_choice(choice)
            if delta is None
            else self.shape.delta_choice(choice, delta)
        )
        if body is not None:
            self._chunk(choice, body)

    def finish(self) -> None:
        run = self.run_state
        error = run.failure()
        if error is not None:
            self._emit(error.body())
        elif self.req.stream_options.include_usage:
            chunk = self.shape.chunk_type(
                id=self.request_id,
                model=run.served_name,
                choices=[],
                created=self.created,
                usage=self.shape.usage(run),
            )
            self._emit(chunk.to_dict())
        assert self.output is not None
        self.output.put(sse.DONE)
