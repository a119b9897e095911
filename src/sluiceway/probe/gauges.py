"""The server's own count of running and waiting requests, where /metrics has one."""

from __future__ import annotations

import attrs

from sluiceway.client import APIError, AsyncClient

# (running, waiting) gauge names by server: vLLM (and sluiceway, which exports the
# same names for routers), SGLang, llama.cpp's server with --metrics.
FAMILIES = (
    ("vllm:num_requests_running", "vllm:num_requests_waiting"),
    ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
    ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
)
METRICS_TIMEOUT_S = 5.0


@attrs.frozen
class Gauges:
    """One reading: requests (or sequences, as the server counts them) running and
    waiting, summed over every label set, and the gauge family they came from."""

    running: float
    waiting: float
    source: str

    @property
    def busy(self) -> float:
        return self.running + self.waiting


async def read_gauges(client: AsyncClient) -> Gauges | None:
    """Read /metrics once (within ``METRICS_TIMEOUT_S``); None when the server has
    no /metrics or none of the known gauges (the caller then judges by what the
    streams show). Cancellation leaves nothing open."""
    try:
        samples = await client.metrics(timeout=METRICS_TIMEOUT_S)
    except APIError:  # APITimeoutError included: a /metrics that hangs is none
        return None
    totals: dict[str, float] = {}
    for key, value in samples.items():
        name = key.partition("{")[0]
        totals[name] = totals.get(name, 0.0) + value
    for running, waiting in FAMILIES:
        if running in totals:
            return Gauges(totals[running], totals.get(waiting, 0.0), running.partition(":")[0])
    return None
