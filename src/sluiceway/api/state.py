"""What every route shares: the engine, configs, metrics and the draining state."""

from __future__ import annotations

import math
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import trio
from quart import current_app

from sluiceway.api.http.errors import APIError, draining, engine_unhealthy, model_not_found
from sluiceway.api.keys.rate_limits import RateLimits
from sluiceway.api.observability.metrics import Metrics
from sluiceway.api.pipeline.formatting import TokenText
from sluiceway.api.responses.store import MemoryResponseStore, ResponseStore
from sluiceway.config import ServerConfig
from sluiceway.engine.engine import Engine
from sluiceway.fleet.kv_events_config import KVEventSource
from sluiceway.grammar.compiler import GrammarCompiler
from sluiceway.grammar.thinking import ThinkingTokens
from sluiceway.reasoning import ReasoningFormat


@attrs.define(eq=False)
class BackgroundRun:
    """A background response still running: `scope` cancels it, `done` is set once
    it has left the engine and stored its final state. `events` is its stream
    events so far when it was created streamed (None: it was not), which any
    number of readers `follow`."""

    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    done: trio.Event = attrs.field(factory=trio.Event)
    events: list[dict[str, Any]] | None = None
    # Its readers wait here for the next event (one per token: no allocation each).
    _news: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)

    def add_event(self, event: dict[str, Any]) -> None:
        assert self.events is not None
        self.events.append(event)
        self._news.unpark_all()

    def end(self) -> None:
        """No event follows (its readers finish)."""
        self.done.set()
        self._news.unpark_all()

    async def follow(self, after: int) -> AsyncIterator[dict[str, Any]]:
        """The events whose `sequence_number` is above `after`, as they come, until
        the last. Cancellation ends the reading only."""
        assert self.events is not None
        index = after + 1
        while True:
            while index < len(self.events):
                yield self.events[index]
                index += 1
            if self.done.is_set():
                return
            await self._news.park()


@attrs.define(eq=False)
class ServerState:
    """Owned by the app (one event loop). Invariant: `active` counts requests inside
    `track()`; each of them has its drain scope in `_drain_scopes`."""

    engine: Engine
    server_config: ServerConfig
    model_name: str
    metrics: Metrics
    token_text: TokenText
    created: int
    # The model's embedding rows, when known: token ids past them would crash a step.
    model_vocab_size: int | None = None
    # Where this replica publishes KV-cache events (None: it does not), and an id
    # unique to this process, by which routers tell replicas' caches apart.
    kv_event_source: KVEventSource | None = None
    instance_id: str = attrs.field(factory=lambda: uuid.uuid4().hex)
    draining: bool = False
    active: int = 0
    _drain_scopes: set[trio.CancelScope] = attrs.field(factory=set)
    _idle: trio.Event = attrs.field(factory=trio.Event)
    # Tokenizing a long prompt runs in a worker thread, one at a time: HF fast
    # tokenizers are not meant for concurrent mutation, and one thread is enough.
    tokenize_limiter: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(1))
    # Preparing a very large request body (see `prompts.prepare`) runs on a thread of
    # its own, one at a time, so heavy requests queue behind each other, not ahead
    # of ordinary ones, and never take more than one core. Encoding without
    # truncation or padding only reads the tokenizer, so the two may run together
    # (the engine's detokenizer already reads it from the model thread).
    heavy_input_limiter: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(1))
    _grammar_compiler: GrammarCompiler | None = None
    # Responses kept for GET /v1/responses/{id} and previous_response_id.
    response_store: ResponseStore = attrs.field(factory=MemoryResponseStore)
    # Where `background: true` responses run (the server's own nursery, which
    # outlives their requests; None: not served), and the cancel scope of each
    # one still running, by response id.
    background_nursery: trio.Nursery | None = None
    # Per-key budgets (`--api-key-budgets`); none by default.
    rate_limits: RateLimits = attrs.field(factory=lambda: RateLimits({}))
    background_runs: dict[str, BackgroundRun] = attrs.field(factory=dict)
    # The streamed background responses that have ended, latest last, so that a
    # reader may still follow their events (`GET ...?stream=true`); bounded.
    ended_streams: OrderedDict[str, BackgroundRun] = attrs.field(factory=OrderedDict)
    # Called once when a drain begins, after new work is refused: background work
    # that must stop at once (the Batch API's lines in flight) registers here.
    drain_hooks: list[Callable[[], None]] = attrs.field(factory=list)
    # How the served model marks its thinking (`--reasoning-parser`; None: thinking
    # is not parsed and stays in the content).
    reasoning: ReasoningFormat | None = None
    _thinking_tokens: ThinkingTokens | None = None

    @property
    def grammar_compiler(self) -> GrammarCompiler:
        """Compiles and caches the grammars of structured outputs and tool calls; it
        reads the tokenizer's vocabulary on its first compile (off the event loop)."""
        if self._grammar_compiler is None:
            self._grammar_compiler = GrammarCompiler(self.tokenizer, self.engine.eos_token_ids)
        return self._grammar_compiler

    def thinking_tokens(self) -> ThinkingTokens:
        """The reasoning format's tags as the grammar forces them. Blocking the first
        time (it reads the grammar compiler's vocabulary): call it off the event
        loop. Only with a reasoning format."""
        assert self.reasoning is not None
        if self._thinking_tokens is None:
            vocab_size = self.grammar_compiler.vocabulary().vocab_size
            self._thinking_tokens = ThinkingTokens.from_tokenizer(
                self.tokenizer, self.reasoning, vocab_size
            )
        return self._thinking_tokens

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def vocab_size(self) -> int:
        size = len(self.engine.tokenizer)
        return size if self.model_vocab_size is None else min(size, self.model_vocab_size)

    def check_model(self, name: str | None) -> int:
        """The LoRA adapter a request's model `name` picks (`SamplingParams.lora_id`;
        0: the base model, which None also names); raises the 404 a request naming
        another model gets."""
        if name is None or name == self.model_name:
            return 0
        module = self.engine.lora_modules.named(name)
        if module is None:
            raise model_not_found(name)
        return module.lora_id

    def check_accepting(self) -> None:
        """Raise the 503 a new generation request gets while draining or unhealthy."""
        if self.draining:
            raise draining()
        if not self.engine.healthy:
            raise engine_unhealthy(self.engine.failure)

    def unavailable_error(self) -> APIError:
        return draining() if self.draining else engine_unhealthy(self.engine.failure)

    def health(self) -> tuple[int, dict[str, Any]]:
        """GET /health's status code and JSON body: 200 while serving, 503 while
        draining or once the engine has failed."""
        if self.draining or not self.engine.healthy:
            status = "draining" if self.draining else "unhealthy"
            return 503, self.unavailable_error().body() | {"status": status}
        return 200, {"status": "ok"}

    def request_deadline_from(self, started_at: float) -> float:
        timeout = self.server_config.request_timeout
        return math.inf if timeout is None else started_at + timeout

    @contextmanager
    def track(self) -> Iterator[trio.CancelScope]:
        """Count a generation request as open; the yielded scope is cancelled when a
        drain's grace period ends, so the request can end its response cleanly."""
        scope = trio.CancelScope()
        self.active += 1
        self._drain_scopes.add(scope)
        try:
            yield scope
        finally:
            self._drain_scopes.discard(scope)
            self.active -= 1
            if self.active == 0:
                self._idle.set()
                self._idle = trio.Event()

    def start_draining(self) -> None:
        """Refuse new work from now on; open requests carry on. Batch lines in
        flight stop at once: they stay pending for the next process."""
        self.draining = True
        self.engine.close()
        for hook in self.drain_hooks:
            hook()

    async def wait_idle(self) -> None:
        while self.active:
            await self._idle.wait()

    def cut_open_requests(self) -> None:
        """The grace period is over: make every open request end its response now."""
        for scope in list(self._drain_scopes):
            scope.cancel()


def current_state() -> ServerState:
    """The state of the app serving the current request (only inside a request)."""
    return current_app.config["SLUICEWAY_STATE"]
