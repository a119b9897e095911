"""The trio face of the engine: one step loop task and a handle for callers.

`Engine` is what the server talks to; `EngineCore` (`core.py`) is the synchronous
scheduler and KV-cache state it drives, which no other task touches.

Data flow: callers `send_nowait` messages into the loop's inbox; the loop is the
only task that touches the `EngineCore`; it runs each step where
`StepPlacement` puts it (the model thread under the watchdog, a small decode on
the event loop's own thread if configured) and delivers deltas with `send_nowait`
into per-choice channels sized so that a send can never block. A slow or
vanished reader therefore never stalls the loop or another stream. Admission
policy lives beside it: the burst window (`arrivals.py`) and the hold-back of
`--stream-interval` (`hold_back.py`).
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import AsyncIterator, Callable, Hashable, Iterable, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any

import attrs
import trio

from sluiceway.config import EngineConfig
from sluiceway.engine.arrivals import Arrivals
from sluiceway.engine.batch import ModelRunner
from sluiceway.engine.core import EngineCore, EngineStats
from sluiceway.engine.errors import EngineUnhealthyError, QueueFullError
from sluiceway.engine.hold_back import HoldBack
from sluiceway.engine.kv_events import KVEventSink
from sluiceway.engine.lora_modules import LoraModules
from sluiceway.engine.outputs import ChoiceDelta
from sluiceway.engine.pooling import Pooling, PoolingSpec
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.engine.step_placement import StepPlacement
from sluiceway.engine.step_threads import CallingThread, ModelThread, StepThread

logger = logging.getLogger(__name__)

ChoiceChannel = trio.MemoryReceiveChannel[ChoiceDelta]

@attrs.frozen
class _AddRequest:
    request_id: int
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    senders: tuple[trio.MemorySendChannel[ChoiceDelta], ...]
    group: Hashable = None
    pooling: Pooling | None = None
    background: bool = False


@attrs.frozen
class _AbortRequest:
    request_id: int


@attrs.frozen
class _ResetPrefixCache:
    reply: trio.MemorySendChannel[bool]


_Message = _AddRequest | _AbortRequest | _ResetPrefixCache


class Engine:
    """Continuous-batching engine driven by one trio task (`run`)."""

    def __init__(
        self,
        runner: ModelRunner,
        tokenizer: Any,
        config: EngineConfig,
        *,
        eos_token_ids: Iterable[int],
        max_model_len: int,
        model_thread: StepThread | None = None,
        openmp_pool_release: Callable[[], None] | None = None,
        lora_modules: LoraModules | None = None,
        lora_check: Callable[[str, str], str] | None = None,
    ) -> None:
        """`model_thread` runs the steps; pass the thread that loaded the model (see
        `step_threads.py`): the engine then owns it and stops it when `run` ends.
        Without one, the engine starts its own, or, with
        `config.steps_on_event_loop`, steps on the event loop's thread. Decodes of
        at most `config.event_loop_decode_max_seqs` (default 0: none) sequences
        run on the event loop's thread too; each time steps move between
        the threads, the one they leave first runs `openmp_pool_release` (the
        builder passes `sluiceway.runner.openmp_teams.find_openmp_pool_release()`;
        without one, steps never move). `lora_modules` are the LoRA adapters the
        runner serves, by the name a request gives (`SamplingParams.lora_id`);
        `lora_check(name, path)` reads and checks an adapter before it is added while
        serving and gives its local directory (a hub id fetched); ValueError naming
        its problem; None: adapters are fixed at start."""
        self.tokenizer = tokenizer
        self.lora_modules = lora_modules if lora_modules is not None else LoraModules()
        self.lora_check = lora_check
        if model_thread is None:
            model_thread = CallingThread() if config.steps_on_event_loop else ModelThread()
        self._placement = StepPlacement(
            model_thread,
            step_timeout=config.step_timeout,
            loop_decode_max_seqs=config.event_loop_decode_max_seqs,
            openmp_pool_release=openmp_pool_release,
        )
        self.config = config
        model_len = min(max_model_len, config.max_model_len or max_model_len)
        self._core = EngineCore(
            runner,
            _decoder(tokenizer),
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            eos_token_ids=eos_token_ids,
            max_model_len=model_len,
            enable_prefix_caching=config.enable_prefix_caching,
            background_step_tokens=config.background_step_tokens,
            max_loras=self.lora_modules.max_loras,
        )
        self.max_model_len = self._core.max_model_len
        self._inbox_send, self._inbox = trio.open_memory_channel[_Message](math.inf)
        # seq id -> (request id, the choice's send channel); owned by the loop
        self._senders: dict[int, tuple[int, trio.MemorySendChannel[ChoiceDelta]]] = {}
        # tokens held back until `stream_interval` of them are ready; owned by the loop
        self._hold_back = HoldBack(config.stream_interval)
        self._live_requests: set[int] = set()
        self._queued_choices = 0  # choices sent to the inbox, not yet seen by the loop
        self._queued_background = 0  # the background ones among them
        self._request_ids = itertools.count()
        self._failure: str | None = None
        self._closed = False
        self._step_boundary = trio.lowlevel.ParkingLot()
        # The server brackets each request's preparation with `arrivals.preparing()`.
        self.arrivals = Arrivals()

    # ---- caller side ------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        return self._failure is None and not self._closed

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """The tokens that end an output."""
        return self._core.eos_token_ids

    @property
    def pooling(self) -> PoolingSpec | None:
        """How the model's embeddings are pooled; None: the runner makes none."""
        return self._core.pooling

    @property
    def failure(self) -> str | None:
        """Why the loop failed, or None while it is well."""
        return self._failure

    def stats(self) -> EngineStats:
        """Load and counters. A failed engine holds no requests: it reports nothing
        running, waiting or using KV blocks, even while an abandoned (hung) step
        thread still has the core."""
        stats = self._core.stats()
        if self._failure is not None:
            return attrs.evolve(stats, num_running_seqs=0, num_waiting_seqs=0, kv_blocks_used=0)
        modules = self.lora_modules

        def names(ids: tuple[int, ...]) -> tuple[str, ...]:
            return tuple(m.name for m in map(modules.with_id, ids) if m is not None)

        return attrs.evolve(
            stats,
            num_waiting_seqs=stats.num_waiting_seqs + self._queued_choices,
            running_lora_adapters=names(stats.running_lora_ids),
            waiting_lora_adapters=names(stats.waiting_lora_ids),
            max_lora=modules.max_loras,
        )

    async def wait_idle(self) -> None:
        """Return once every accepted request has finished or been aborted and the
        engine holds no sequences (immediately if the engine has failed).
        Cancelling the wait affects nothing else."""
        while self._failure is None and (self._live_requests or self._core.has_work()):
            await self._step_boundary.park()

    def close(self) -> None:
        """Stop admitting work (draining); requests already accepted carry on."""
        self._closed = True

    async def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (subscribers to KV events get
        `AllBlocksCleared`), at the loop's next step boundary. True if done; False,
        changing nothing, while a request holds KV blocks or when the engine has
        failed or is draining. Cancelling the wait does not withdraw the reset."""
        if not self.healthy:
            return False
        reply, result = trio.open_memory_channel[bool](1)
        self._inbox_send.send_nowait(_ResetPrefixCache(reply))
        with result:
            try:
                return await result.receive()
            except trio.EndOfChannel:  # the loop stopped before it got there
                return False

    @property
    def block_size(self) -> int:
        return self._core.blocks.block_size

    def attach_kv_event_sink(self, sink: KVEventSink | None) -> None:
        """Report the prefix cache's block lifecycle to `sink` (see `kv_events`), or
        stop (None). Call before `run`. The sink is called by whichever thread runs
        the core (the model thread during a step), so it must only hand events on."""
        self._core.blocks.event_sink = sink

    @asynccontextmanager
    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        n: int = 1,
        group: Hashable = None,
        background: bool = False,
    ) -> AsyncIterator[tuple[ChoiceChannel, ...]]:
        """Generate `n` choices for one prompt; yields one receive channel per choice.
        Calls with the same `group` (the prompts of one client request) share one
        fair turn for sequence slots (see `Scheduler`); None: a group of its own.
        `background` choices (Batch API lines) yield to every other.

        Each channel delivers `ChoiceDelta`s; the last has a finish_reason and then
        the channel ends. On entry raises EngineUnhealthyError (failed or
        draining), QueueFullError (more than `max_waiting` choices would wait for
        a sequence slot) or PromptTooLongError. Leaving the block for any reason
        (finished, error, cancellation) aborts the unfinished choices without
        blocking; the engine frees their KV blocks before its next step.
        """
        request_id, receivers = self._submit(prompt_token_ids, params, n, group, None, background)
        try:
            yield receivers
        finally:
            for receiver in receivers:
                receiver.close()
            if request_id in self._live_requests:
                self._inbox_send.send_nowait(_AbortRequest(request_id))

    async def embed(
        self,
        prompt_token_ids: Sequence[int],
        *,
        group: Hashable = None,
        background: bool = False,
        lora_id: int = 0,
    ) -> ChoiceDelta:
        """The embedding of one prompt: its final delta, whose `embedding` is the
        model's pooled hidden state (`pooling`, not normalized) and whose counts give
        the prompt's tokens. The prompt is scheduled, chunked and batched like any
        other, as one prefill-only sequence; `group` and `background` as for
        `generate`; `lora_id` names the LoRA adapter to run it through (0: none).

        Raises on entry as `generate` does, ValueError when the runner makes no
        embeddings, and EngineUnhealthyError when the engine fails before the
        embedding is ready. Cancellation aborts the sequence without blocking; the
        engine frees its KV blocks before its next step.
        """
        if self.pooling is None:
            raise ValueError("this model runner does not produce embeddings")
        request_id, (receiver,) = self._submit(
            prompt_token_ids,
            SamplingParams(max_tokens=1, lora_id=lora_id),
            1,
            group,
            self.pooling.pooling,
            background,
        )
        try:
            async for delta in receiver:
                if delta.finish_reason == "error" or delta.embedding is None:
                    raise EngineUnhealthyError(delta.error or "the engine failed")
                return delta
            raise EngineUnhealthyError(self._failure or "the engine stopped")
        finally:
            receiver.close()
            if request_id in self._live_requests:
                self._inbox_send.send_nowait(_AbortRequest(request_id))

    def _submit(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        n: int,
        group: Hashable,
        pooling: Pooling | None = None,
        background: bool = False,
    ) -> tuple[int, tuple[ChoiceChannel, ...]]:
        if n < 1:
            raise ValueError("n must be at least 1")
        if not self.healthy:
            raise EngineUnhealthyError(self._failure or "the engine is shutting down")
        self._core.check_prompt(prompt_token_ids, embedding=pooling is not None)
        waiting = self._choices_waiting_for_a_slot(background)
        # An empty queue always admits, so a request with n > max_waiting is not
        # refused forever on an idle server.
        if waiting and waiting + n > self.config.max_waiting:
            raise QueueFullError(f"more than {self.config.max_waiting} choices are waiting")
        request_id = next(self._request_ids)
        # One delta per generated token, plus a flush or an error: a send never blocks.
        capacity = (params.max_tokens or self.max_model_len) + 2
        channels = [trio.open_memory_channel[ChoiceDelta](capacity) for _ in range(n)]
        self._live_requests.add(request_id)
        self._queued_choices += n
        self._queued_background += n if background else 0
        self._inbox_send.send_nowait(
            _AddRequest(
                request_id,
                tuple(prompt_token_ids),
                params,
                tuple(s for s, _ in channels),
                group,
                pooling,
                background,
            )
        )
        self.arrivals.arrived()
        return request_id, tuple(r for _, r in channels)

    def _choices_waiting_for_a_slot(self, background: bool) -> int:
        """The choices not yet running beyond the free sequence slots: of every
        class for a `background` submission, of the foreground only for another
        (background sequences yield their slots and their turn to it, so they
        never fill its queue).

        Counting against the free slots, not every choice not yet running, keeps
        the bound the same whether or not the loop has already scheduled what
        arrived just before (it holds an idle engine's first step for a burst)."""
        if background:
            stats = self.stats()
            running, waiting = stats.num_running_seqs, stats.num_waiting_seqs
        else:
            running, waiting = self._core.foreground_load()
            waiting += self._queued_choices - self._queued_background
        free_slots = max(0, self.config.max_num_seqs - running)
        return max(0, waiting - free_slots)

    # ---- the loop ----------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The one engine loop. Runs until cancelled. Woken from idle by a request,
        it first lets the rest of a burst arrive (`_let_burst_arrive`).

        A failing step does not raise out of here: every open choice receives an
        error delta, the engine turns unhealthy and later requests are refused.
        On cancellation the step in flight finishes and its tokens are delivered
        (a thread cannot be interrupted; only the watchdog abandons a step, so
        the wait is bounded by `step_timeout`), then every open choice receives
        an error delta. Whenever it ends, it stops the model thread and returns
        only once that thread has exited, unless the watchdog abandoned a step on
        it (then the thread exits when that step returns).
        """
        task_status.started()
        try:
            while True:
                self._drain_inbox()
                if not self._core.has_work():
                    self._step_boundary.unpark_all()
                    self._handle(await self._inbox.receive())
                    if self._core.has_work():
                        await self._let_burst_arrive()
                    continue
                try:
                    deltas = await self._step()
                except Exception as exc:
                    logger.exception("engine step failed")
                    self._fail(f"engine step failed: {type(exc).__name__}: {exc}")
                    self._core.abort_all()  # the step is over, so the core is ours again
                    return
                if deltas is None:
                    logger.error("engine step exceeded %s s; failing open requests", self.config.step_timeout)
                    self._fail(f"engine step exceeded the {self.config.step_timeout} s watchdog limit")
                    return
                self._deliver(deltas)
                self._step_boundary.unpark_all()
                # A step that cannot be abandoned returns normally even when the loop
                # was cancelled while it ran; stop here rather than step on until
                # every request is done.
                await trio.lowlevel.checkpoint_if_cancelled()
        finally:
            if self._failure is None:
                self._fail("the engine stopped")
            self._placement.stop()
            # No torch may run once the caller's trio.run returns: the interpreter
            # may be exiting (see `ModelThread.join`).
            with trio.CancelScope(shield=True):
                await self._placement.join()

    async def _let_burst_arrive(self) -> None:
        """Return once the burst has arrived, or after `config.burst_window`
        seconds (`Arrivals.wait_for_burst`). Called when a request wakes the idle
        engine."""
        await self.arrivals.wait_for_burst(self.config.burst_window)

    async def _step(self) -> list[tuple[int, ChoiceDelta]] | None:
        """Run one step where `StepPlacement` puts it; None if the watchdog fired."""
        max_seqs = self._placement.loop_decode_max_seqs
        small_decode = bool(max_seqs) and self._core.next_step_only_decodes(max_seqs)
        return await self._placement.run(self._core.step, on_event_loop=small_decode)

    def _drain_inbox(self) -> None:
        while True:
            try:
                message = self._inbox.receive_nowait()
            except trio.WouldBlock:
                return
            self._handle(message)

    def _handle(self, message: _Message) -> None:
        if isinstance(message, _AbortRequest):
            self._abort(message.request_id)
            return
        if isinstance(message, _ResetPrefixCache):
            done = self._core.blocks.reset_prefix_cache()
            with message.reply, suppress(trio.BrokenResourceError):  # its caller may have left
                message.reply.send_nowait(done)
            return
        self._queued_choices -= len(message.senders)
        self._queued_background -= len(message.senders) if message.background else 0
        if message.request_id not in self._live_requests:
            return  # the caller left before the loop saw the request
        seq_ids = self._core.add_request(
            message.request_id,
            message.prompt_token_ids,
            message.params,
            len(message.senders),
            group=message.group,
            pooling=message.pooling,
            background=message.background,
        )
        for seq_id, sender in zip(seq_ids, message.senders, strict=True):
            self._senders[seq_id] = (message.request_id, sender)

    def _abort(self, request_id: int) -> None:
        self._live_requests.discard(request_id)
        for seq_id in self._core.abort_request(request_id):
            self._senders.pop(seq_id)[1].close()
            self._hold_back.take(seq_id)

    def _deliver(self, deltas: list[tuple[int, ChoiceDelta]]) -> None:
        for seq_id, delta in deltas:
            entry = self._senders.get(seq_id)
            if entry is None:
                continue
            ready = self._hold_back.ready(seq_id, delta)
            if ready is None:
                continue
            request_id, sender = entry
            try:
                sender.send_nowait(ready)
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
                pass  # the reader is gone; the request's abort is on its way
            if ready.finish_reason is not None:
                del self._senders[seq_id]
                sender.close()
                if not self._core.has_request(request_id):
                    self._live_requests.discard(request_id)

    def _fail(self, reason: str) -> None:
        self._failure = reason
        error = ChoiceDelta((), "", finish_reason="error", error=reason)
        for seq_id, (_, sender) in self._senders.items():
            held = self._hold_back.take(seq_id)
            try:
                if held is not None:  # tokens already made are not lost
                    sender.send_nowait(held)
                sender.send_nowait(error)
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
                pass
            sender.close()
        self._senders.clear()
        self._drain_after_failure(error)

    def _drain_after_failure(self, error: ChoiceDelta) -> None:
        # Requests submitted while the failing step ran are answered too: nobody
        # may wait on a loop that has stopped.
        while True:
            try:
                message = self._inbox.receive_nowait()
            except trio.WouldBlock:
                break
            if isinstance(message, _AddRequest):
                for sender in message.senders:
                    with suppress(trio.BrokenResourceError):
                        sender.send_nowait(error)  # the caller may have left already
                    sender.close()
            elif isinstance(message, _ResetPrefixCache):
                message.reply.close()  # its caller gets False
        self._live_requests.clear()
        self._queued_choices = 0
        self._queued_background = 0
        self._step_boundary.unpark_all()


def _decoder(tokenizer: Any):
    def decode(ids: Sequence[int]) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=True)

    return decode
