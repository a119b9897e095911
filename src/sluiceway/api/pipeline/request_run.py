"""Running one request's choices: admission, per-choice consumers, timeouts.

Shape: the request enters `engine.generate` once per prompt (all inside one
`AsyncExitStack`, so leaving it for any reason aborts every unfinished choice),
then runs one consumer task per choice in one nursery. Each consumer reads only
its own engine channel, so a finished or slow choice never holds up another.
The request deadline (`--request-timeout`) and the drain scope wrap that nursery;
a client disconnect cancels it from outside.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack

import attrs
import trio

from sluiceway.api.http import errors
from sluiceway.api.http.errors import APIError, invalid_request, queue_full
from sluiceway.api.keys.rate_limits import TokenCharge
from sluiceway.api.pipeline.prompts import Prompt
from sluiceway.api.pipeline.tool_calls import ToolCallParser
from sluiceway.api.state import ServerState
from sluiceway.engine.errors import EngineUnhealthyError, PromptTooLongError, QueueFullError
from sluiceway.engine.outputs import ChoiceDelta, TokenLogprob
from sluiceway.engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)

ChoiceChannel = trio.MemoryReceiveChannel[ChoiceDelta]


@attrs.define(eq=False)
class ChoiceState:
    """One choice's progress; owned by its consumer task."""

    index: int
    prompt: Prompt
    text_parts: list[str] = attrs.field(factory=list)
    part_tokens: list[int] = attrs.field(factory=list)  # tokens of each text part
    logprobs: list[TokenLogprob] = attrs.field(factory=list)
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    error: str | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    text_offset: int = 0  # characters of output sent so far (completions logprobs)
    tool_parser: ToolCallParser | None = None  # when the chat shape parses tool calls

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


@attrs.define(eq=False)
class RequestRun:
    """One request in flight. `deadline_scope` expires at the request timeout;
    `drain_scope` is cancelled when a drain's grace period ends."""

    state: ServerState
    prompts: Sequence[Prompt]
    n: int
    started_at: float
    choices: list[ChoiceState] = attrs.field(factory=list)
    deadline_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    drain_scope: trio.CancelScope | None = None
    error: str | None = None
    # The engine schedules the prompts of one request as one fair share.
    group: object = attrs.field(factory=object)
    # A Batch API line: its choices yield to every other in the engine.
    background: bool = False
    # What the key was charged before the run; `settle` makes it what the run used.
    charge: TokenCharge | None = None
    # The LoRA adapter's name when the request picked one (its responses say it).
    adapter_name: str | None = None

    @property
    def served_name(self) -> str:
        """The model name the responses give: the adapter's, or the base model's."""
        return self.adapter_name or self.state.model_name

    @property
    def timed_out(self) -> bool:
        return self.deadline_scope.cancelled_caught

    @property
    def cut_by_drain(self) -> bool:
        return self.drain_scope is not None and self.drain_scope.cancelled_caught

    def failure(self) -> APIError | None:
        """What ended the run early, as the error its client gets (None: it ran
        to the end): the engine failed, the request timed out, or a drain cut it."""
        if self.error is not None:
            return errors.engine_unhealthy(self.error)
        if self.timed_out:
            return errors.timeout(self.state.server_config.request_timeout)
        if self.cut_by_drain:
            return errors.draining()
        return None

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p.token_ids) for p in self.prompts)

    @property
    def completion_tokens(self) -> int:
        return sum(c.num_output_tokens for c in self.choices)

    @property
    def tokens_used(self) -> int:
        """What the run costs its key: the prompts the engine took, and every token
        generated for them, however far each choice got."""
        admitted = {c.index // self.n for c in self.choices}
        prompts = sum(len(self.prompts[i].token_ids) for i in admitted)
        return prompts + self.completion_tokens

    def settle(self) -> None:
        """Charges the key `tokens_used` instead of its estimate; once, so that every
        way out of a request may call it."""
        if self.charge is not None:
            self.charge.settle(self.tokens_used)

    @property
    def cached_tokens(self) -> int:
        by_prompt: dict[int, int] = {}
        for c in self.choices:
            by_prompt[c.index // self.n] = max(
                by_prompt.get(c.index // self.n, 0), c.num_cached_tokens
            )
        return sum(by_prompt.values())


async def admit(
    run: RequestRun, stack: AsyncExitStack, params: SamplingParams, param: str
) -> list[ChoiceChannel]:
    """Enter `engine.generate` for every prompt; the channels in choice-index order.

    Raises APIError (429/503/400) when the engine refuses; prompts already admitted
    are then aborted when `stack` closes. Closing `stack` also settles the run's
    charge, once its choices have left the engine.
    """
    # Callbacks run last-in first-out: this one after every choice is aborted, when
    # the counts are final, however the run ends (done, refused, timed out, gone).
    stack.callback(run.settle)
    state = run.state
    channels: list[ChoiceChannel] = []
    for i, prompt in enumerate(run.prompts):
        try:
            got = await stack.enter_async_context(
                state.engine.generate(
                    prompt.token_ids, params, n=run.n, group=run.group, background=run.background
                )
            )
        except QueueFullError:
            raise queue_full() from None
        except EngineUnhealthyError:
            raise state.unavailable_error() from None
        except PromptTooLongError as exc:
            raise APIError(
                400, str(exc), "invalid_request_error", param, "context_length_exceeded"
            ) from None
        except ValueError as exc:
            raise invalid_request(str(exc), param) from None
        for j, channel in enumerate(got):
            run.choices.append(ChoiceState(index=i * run.n + j, prompt=prompt))
            channels.append(channel)
    return channels


Sink = Callable[[ChoiceState, ChoiceDelta | None], Awaitable[None]]


async def _consume(
    run: RequestRun,
    choice: ChoiceState,
    channel: ChoiceChannel,
    sink: Sink,
    on_error: Callable[[], None],
) -> None:
    """Read one choice's deltas into `sink` (None first, as a "choice opened" signal).

    Cancellation (timeout, drain, disconnect) just stops reading; the request's
    exit stack aborts the choice in the engine.
    """
    metrics = run.state.metrics
    try:
        await sink(choice, None)
        async for delta in channel:
            now = trio.current_time()
            if delta.token_ids:
                if choice.first_token_at is None:
                    metrics.ttft.observe(now - run.started_at)
                    choice.first_token_at = now
                elif choice.last_token_at is not None:
                    count = len(delta.token_ids)
                    metrics.itl.observe((now - choice.last_token_at) / count, count)
                choice.last_token_at = now
            choice.num_output_tokens = delta.num_output_tokens
            choice.num_cached_tokens = delta.num_cached_prompt_tokens
            if delta.finish_reason is not None:
                choice.finish_reason = delta.finish_reason
                choice.stop_reason = delta.stop_reason
                choice.error = delta.error
            if delta.finish_reason == "error":
                run.error = run.error or delta.error or "the engine failed"
                on_error()
                return
            await sink(choice, delta)
        if choice.finish_reason is None:
            choice.finish_reason = "abort"
    finally:
        reason = choice.finish_reason
        if reason is None:
            reason = "timeout" if run.deadline_scope.cancel_called else "abort"
        metrics.record_finish(reason)


async def run_choices(run: RequestRun, channels: Sequence[ChoiceChannel], sink: Sink) -> None:
    """Consume every choice concurrently until all finish, the deadline passes, the
    drain grace ends, or one choice reports an engine error (which ends the rest)."""
    with run.deadline_scope:
        # A batch line waits for the foreground by design: no request timeout for it.
        if not run.background:
            run.deadline_scope.deadline = run.state.request_deadline_from(run.started_at)
        async with trio.open_nursery() as nursery:
            for choice, channel in zip(run.choices, channels, strict=True):
                nursery.start_soon(
                    _consume, run, choice, channel, sink, nursery.cancel_scope.cancel
                )
