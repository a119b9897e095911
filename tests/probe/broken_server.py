"""A loopback OpenAI-compatible server with the peer failures one can switch on, so
that every probe scenario can be shown to fail against the server it was written
for. One engine task hands out tokens each tick, two a tick at most, round robin
over the running choices (so a choice runs faster when fewer share the engine);
each request writes its own SSE response from a channel, and notices a hang-up by
reading its socket. Pure trio: under the autojump clock a tick costs nothing."""

from __future__ import annotations

import functools
import itertools
import json
import socket
from collections import deque
from typing import Any

import attrs
import h11
import trio

TICK_S = 0.01
TOKENS_PER_TICK = 2
WORDS = (" the", " river", " flows", " under", " a", " quiet", " bridge", " and", " on")
TOOL_ARGUMENTS = ('{"city', '": "', "Paris", '"}')
JSON_ANSWER = ('{"', "ok", '": ', "true", "}")


@attrs.frozen
class Flaws:
    """The failures to show; all off is a server that behaves."""

    serialise: bool = False  # only the oldest running choice gets tokens
    index_zero: bool = False  # every choice goes out as index 0
    stall_after_stop: bool = False  # once one choice of a request ends, the rest get nothing
    lockstep_writes: bool = False  # the engine waits for each write to the socket
    ignore_disconnect: bool = False  # a hung-up request decodes on to max_tokens
    leak_slot_on_disconnect: bool = False  # a hung-up request never gives its slot back
    refuse_without_retry_after: bool = False  # 429 without Retry-After
    usage_first_choice_only: bool = False  # completion_tokens counts choice 0 alone
    split_entries: bool = False  # a chunk carries one index twice (its delta in halves)
    tool_call_without_id: bool = False  # the first tool-call delta lacks id and type
    refuse_tools: bool = False  # a 400 for any request with tools


@attrs.define(eq=False)
class Choice:
    index: int
    key: int  # picks this choice's words, so siblings differ
    max_tokens: int
    pieces: tuple[str, ...] | None = None  # a fixed answer (tool arguments, JSON)
    stop: tuple[str, ...] = ()
    produced: int = 0
    finish_reason: str | None = None


@attrs.define(eq=False)
class Request:
    body: dict[str, Any]
    choices: list[Choice]
    send: trio.MemorySendChannel[tuple[Choice, str, str | None, bool]]
    stream: trio.SocketStream | None = None
    connection: h11.Connection | None = None
    gone: bool = False


@attrs.define(eq=False)
class BrokenServer:
    """Serve with ``nursery.start(server.serve)``; ``url`` is then set. ``slots``
    bounds the requests decoding at once and ``max_waiting`` those waiting for a
    slot (None: unbounded; past it a 429)."""

    flaws: Flaws = attrs.field(factory=Flaws)
    slots: int | None = None
    max_waiting: int | None = None
    metrics: bool = True
    url: str = ""
    running: list[Choice] = attrs.field(factory=list)
    owners: dict[int, Request] = attrs.field(factory=dict)
    waiting: deque[trio.Event] = attrs.field(factory=deque)
    busy_slots: int = 0
    _keys: Any = attrs.field(factory=itertools.count)
    _turn: int = 0

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                functools.partial(trio.serve_tcp, self._connection, 0, host="127.0.0.1")
            )
            port = listeners[0].socket.getsockname()[1]
            self.url = f"http://127.0.0.1:{port}"
            nursery.start_soon(self._engine)
            task_status.started(self)

    # ----------------------------------------------------------------- engine

    async def _engine(self) -> None:
        while True:
            await trio.sleep(TICK_S)
            ready = [c for c in self.running if self._may_run(c)]
            if self.flaws.serialise:
                ready = ready[:1]
            if not ready:
                continue
            start = self._turn % len(ready)
            self._turn += TOKENS_PER_TICK
            for choice in (ready[start:] + ready[:start])[:TOKENS_PER_TICK]:
                await self._produce(choice)

    def _may_run(self, choice: Choice) -> bool:
        request = self.owners[id(choice)]
        if self.flaws.stall_after_stop and any(c.finish_reason for c in request.choices):
            return False
        return choice.finish_reason is None

    async def _produce(self, choice: Choice) -> None:
        request = self.owners[id(choice)]
        if choice.pieces is not None:
            piece = choice.pieces[choice.produced]
            choice.produced += 1
            done = choice.produced == len(choice.pieces)
            reason = ("tool_calls" if "tools" in request.body else "stop") if done else None
        else:
            piece = WORDS[(choice.key * 5 + choice.produced) % len(WORDS)]
            choice.produced += 1
            reason = "length" if choice.produced >= choice.max_tokens else None
            if piece in choice.stop:
                piece, reason = "", "stop"
        choice.finish_reason = reason
        if reason is not None:
            self.running.remove(choice)
        if request.gone:
            return  # a zombie: decoded for nobody
        written = self.flaws.lockstep_writes
        if written:
            await _write(request, _event(request, choice, piece, reason, self.flaws))
        request.send.send_nowait((choice, piece, reason, written))

    # ------------------------------------------------------------------- HTTP

    async def _connection(self, stream: trio.SocketStream) -> None:
        if self.flaws.lockstep_writes:
            stream.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        connection = h11.Connection(h11.SERVER)
        request, body = await _read_request(stream, connection)
        if request is None:
            return
        target = request.target.decode()
        if request.method == b"GET":
            await self._get(stream, connection, target)
        else:
            await self._post(stream, connection, json.loads(body or b"{}"))
        await stream.aclose()

    async def _get(
        self, stream: trio.SocketStream, connection: h11.Connection, target: str
    ) -> None:
        if target == "/v1/models":
            body = {
                "object": "list",
                "data": [{"id": "broken", "object": "model", "created": 0, "owned_by": "t"}],
            }
            await _respond(stream, connection, 200, json.dumps(body).encode())
        elif target == "/metrics" and self.metrics:
            waiting = len(self.waiting)
            text = f'vllm:num_requests_running{{model_name="broken"}} {len(self.running)}\nvllm:num_requests_waiting {waiting}\n'
            await _respond(stream, connection, 200, text.encode(), "text/plain")
        else:
            await _respond(stream, connection, 404, b'{"error": {"message": "not found"}}')

    async def _post(
        self, stream: trio.SocketStream, connection: h11.Connection, body: dict[str, Any]
    ) -> None:
        if self.flaws.refuse_tools and body.get("tools"):
            await _respond(
                stream, connection, 400, b'{"error": {"message": "tools are not supported"}}'
            )
            return
        if self.slots is not None and self.busy_slots >= self.slots:
            if self.max_waiting is not None and len(self.waiting) >= self.max_waiting:
                headers = [] if self.flaws.refuse_without_retry_after else [("Retry-After", "1")]
                await _respond(
                    stream, connection, 429, b'{"error": {"message": "queue full"}}', extra=headers
                )
                return
            turn = trio.Event()
            self.waiting.append(turn)
            try:
                await turn.wait()
            finally:
                if turn in self.waiting:
                    self.waiting.remove(turn)
        self.busy_slots += 1
        send, receive = trio.open_memory_channel[tuple[Choice, str, str | None, bool]](float("inf"))
        request = Request(body, self._choices(body), send, stream, connection)
        for choice in request.choices:
            self.owners[id(choice)] = request
            self.running.append(choice)
        try:
            if body.get("stream"):
                await self._stream(request, receive)
            else:
                await self._whole(request, receive)
        finally:
            self._end(request)

    def _choices(self, body: dict[str, Any]) -> list[Choice]:
        prompts = body.get("prompt")
        count = len(prompts) if isinstance(prompts, list) else 1
        conversations = body.get("messages") or []
        if conversations and isinstance(conversations[0], list):  # batch chat
            count = len(conversations)
        count *= int(body.get("n") or 1)
        stop = body.get("stop") or ()
        stop = (stop,) if isinstance(stop, str) else tuple(stop)
        pieces = (
            TOOL_ARGUMENTS
            if body.get("tools")
            else JSON_ANSWER
            if body.get("response_format")
            else None
        )
        return [
            Choice(i, next(self._keys), int(body.get("max_tokens") or 16), pieces, stop)
            for i in range(count)
        ]

    def _end(self, request: Request) -> None:
        if request.gone and self.flaws.ignore_disconnect:
            return  # the zombies run on; their slot stays taken
        for choice in request.choices:
            if choice in self.running:
                self.running.remove(choice)
        if request.gone and self.flaws.leak_slot_on_disconnect:
            return
        self.busy_slots -= 1
        if self.waiting:
            self.waiting.popleft().set()

    async def _stream(self, request: Request, receive: trio.MemoryReceiveChannel[Any]) -> None:
        assert request.connection is not None and request.stream is not None
        head = h11.Response(
            status_code=200,
            headers=[("Content-Type", "text/event-stream"), ("Connection", "close")],
        )
        await request.stream.send_all(request.connection.send(head))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_hang_up, request, nursery.cancel_scope)
            unfinished = len(request.choices)
            while unfinished:
                choice, piece, reason, written = await receive.receive()
                if not written:
                    await _write(request, _event(request, choice, piece, reason, self.flaws))
                unfinished -= reason is not None
            if (request.body.get("stream_options") or {}).get("include_usage"):
                usage = _usage(request, self.flaws)
                await _write(request, f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n")
            await _write(request, "data: [DONE]\n\n")
            await request.stream.send_all(request.connection.send(h11.EndOfMessage()))
            nursery.cancel_scope.cancel()

    async def _whole(self, request: Request, receive: trio.MemoryReceiveChannel[Any]) -> None:
        assert request.connection is not None and request.stream is not None
        texts = {c.index: "" for c in request.choices}
        unfinished = len(request.choices)
        while unfinished:
            choice, piece, reason, _ = await receive.receive()
            texts[choice.index] += piece
            unfinished -= reason is not None
        choices = [
            {
                "index": c.index,
                "message": {"role": "assistant", "content": texts[c.index]},
                "finish_reason": c.finish_reason,
                "logprobs": {
                    "content": [{"token": "t", "logprob": -0.25, "top_logprobs": []}] * c.produced
                }
                if request.body.get("logprobs")
                else None,
            }
            for c in request.choices
        ]
        reply = {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "broken",
            "choices": choices,
            "usage": _usage(request, self.flaws),
        }
        await _respond(request.stream, request.connection, 200, json.dumps(reply).encode())


def _event(request: Request, choice: Choice, piece: str, reason: str | None, flaws: Flaws) -> str:
    chat = "messages" in request.body
    index = 0 if flaws.index_zero else choice.index
    if chat:
        delta: dict[str, Any] = {"content": piece}
        if choice.pieces is not None and request.body.get("tools"):
            call: dict[str, Any] = {"index": 0, "function": {"arguments": piece}}
            if choice.produced == 1:
                call["function"]["name"] = "get_weather"
                if not flaws.tool_call_without_id:
                    call.update(id=f"call_{choice.key}", type="function")
            delta = {"tool_calls": [call]}
        entry: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": reason}
        if request.body.get("logprobs") and piece:
            entry["logprobs"] = {
                "content": [{"token": piece, "logprob": -0.25, "top_logprobs": []}]
            }
    else:
        entry = {"index": index, "text": piece, "finish_reason": reason}
    entries = [entry]
    if flaws.split_entries and piece:
        first, second = dict(entry), dict(entry)
        key = "delta" if chat else "text"
        if chat and "content" in entry["delta"]:
            first[key] = {"content": piece[: len(piece) // 2]}
            second[key] = {"content": piece[len(piece) // 2 :]}
        first["finish_reason"] = None
        entries = [first, second]
    kind = "chat.completion.chunk" if chat else "text_completion"
    return f"data: {json.dumps({'id': 'x', 'object': kind, 'created': 0, 'model': 'broken', 'choices': entries})}\n\n"


def _usage(request: Request, flaws: Flaws) -> dict[str, int]:
    counted = request.choices[:1] if flaws.usage_first_choice_only else request.choices
    completion = sum(c.produced - (c.finish_reason == "stop" and c.pieces is None) for c in counted)
    return {"prompt_tokens": 7, "completion_tokens": completion, "total_tokens": 7 + completion}


async def _write(request: Request, text: str) -> None:
    if request.gone:
        return
    assert request.connection is not None and request.stream is not None
    try:
        await request.stream.send_all(request.connection.send(h11.Data(data=text.encode())))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        request.gone = True


async def _watch_hang_up(request: Request, scope: trio.CancelScope) -> None:
    """The client sends nothing after its request, so EOF here is a hang-up."""
    assert request.stream is not None
    try:
        data = await request.stream.receive_some(1024)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        data = b""
    if not data:
        request.gone = True
        scope.cancel()


async def _read_request(
    stream: trio.SocketStream, connection: h11.Connection
) -> tuple[h11.Request | None, bytes]:
    request, body = None, b""
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(65536)
            if not data:
                return None, b""
            connection.receive_data(data)
        elif isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return request, body
        else:
            return None, b""


async def _respond(
    stream: trio.SocketStream,
    connection: h11.Connection,
    status: int,
    body: bytes,
    content_type: str = "application/json",
    extra: list[tuple[str, str]] | None = None,
) -> None:
    headers = [
        ("Content-Type", content_type),
        ("Content-Length", str(len(body))),
        ("Connection", "close"),
        *(extra or []),
    ]
    await stream.send_all(connection.send(h11.Response(status_code=status, headers=headers)))
    await stream.send_all(connection.send(h11.Data(data=body)))
    await stream.send_all(connection.send(h11.EndOfMessage()))
