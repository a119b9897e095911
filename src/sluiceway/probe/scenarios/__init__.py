"""The probe's scenarios, in the order they run, each with where it comes from."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import attrs

from sluiceway.probe.context import Outcome, ProbeContext
from sluiceway.probe.scenarios import (
    cancellation,
    deltas,
    disconnect,
    early_stop,
    overload,
    seed,
    stalled_reader,
    usage,
)


@attrs.frozen
class Scenario:
    """A named check. ``max_requests`` is the most it sends (the ledger holds it to
    that); ``weight`` its share of the time budget; ``origin`` the peer issue it
    comes from."""

    name: str
    run: Callable[[ProbeContext], Awaitable[Outcome]]
    max_requests: int
    weight: float
    origin: str


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("parallel_streams", seed.parallel_streams, seed.WAYS, 1, "the seed, LMDeploy #3144"),
    Scenario("batch_prompts", seed.batch_prompts, 1, 1, "the seed, LMDeploy #3144"),
    Scenario("batch_chat", seed.batch_chat, 1, 1, "the seed's own request, LMDeploy #3144"),
    Scenario("n_choices", seed.n_choices, 1, 1, "the seed; n>1 multiplexed into index 0"),
    Scenario(
        "early_stop", early_stop.early_stop, len(early_stop.SEEDS), 1, "the seed, LMDeploy #3144"
    ),
    Scenario(
        "stalled_reader",
        stalled_reader.stalled_reader,
        2 * stalled_reader.OTHERS + 2,
        2,
        "one reader's backpressure holding the shared loop",
    ),
    Scenario(
        "disconnect_frees_work",
        disconnect.disconnect_frees_work,
        disconnect.STREAMS,
        2,
        "llama.cpp #24496, vLLM #54947",
    ),
    Scenario(
        "client_cancel",
        cancellation.client_cancel,
        cancellation.ROUNDS + cancellation.FOLLOW_TRIES,
        1,
        "SGLang #37833, #36475",
    ),
    Scenario(
        "reconnect_storm",
        cancellation.reconnect_storm,
        cancellation.STORM + cancellation.FOLLOW_TRIES,
        1,
        "SGLang #37833, #36475",
    ),
    Scenario("overload", overload.overload, overload.BURST, 2, "unbounded waiting queues"),
    Scenario("usage_finish", usage.usage_finish, 4, 1, "n>1 usage and finish reasons"),
    Scenario("tool_call_deltas", deltas.tool_call_deltas, 1, 1, "one entry per index per chunk"),
    Scenario(
        "structured_output_deltas",
        deltas.structured_output_deltas,
        1,
        1,
        "one entry per index per chunk",
    ),
)

BY_NAME = {s.name: s for s in SCENARIOS}

__all__ = ["BY_NAME", "SCENARIOS", "Scenario"]
