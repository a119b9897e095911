"""Prometheus metrics with their own registry (one per app, so tests can run many apps).

Engine-side numbers (running/waiting sequences, KV blocks, token and preemption
totals) are read from `engine.stats()` at scrape time by a custom collector, so
the engine keeps no prometheus dependency and the counters can never drift from
its own totals. Per-request timings and finish reasons are recorded by the API.
`sluiceway_requests_finished_total{reason}` counts choices (sequences), like
`sluiceway_requests_running`.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

FINISH_REASONS = ("stop", "length", "abort", "timeout", "error")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)


class _EngineCollector(Collector):
    def __init__(self, stats: Callable[[], Any]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        gauges = [
            (
                "sluiceway_requests_running",
                "Sequences (choices) running in the engine.",
                s.num_running_seqs,
            ),
            (
                "sluiceway_requests_waiting",
                "Sequences (choices) waiting to be scheduled.",
                s.num_waiting_seqs,
            ),
            ("sluiceway_kv_cache_blocks_used", "KV cache blocks in use.", s.kv_blocks_used),
            ("sluiceway_kv_cache_blocks_total", "KV cache blocks in all.", s.kv_blocks_total),
        ]
        for name, doc, value in gauges:
            yield GaugeMetricFamily(name, doc, value=value)
        counters = [
            ("sluiceway_prompt_tokens", "Prompt tokens processed.", s.prompt_tokens_total),
            ("sluiceway_generation_tokens", "Tokens generated.", s.generation_tokens_total),
            (
                "sluiceway_preemptions",
                "Sequences preempted for lack of KV blocks.",
                s.num_preemptions_total,
            ),
            (
                "sluiceway_grammar_mask_rows",
                "Next-token masks filled for constrained choices (one per token).",
                s.grammar_mask_rows_total,
            ),
            (
                "sluiceway_grammar_mask_fill_seconds",
                "Time spent filling next-token masks, beside the model step.",
                s.grammar_mask_fill_seconds_total,
            ),
            (
                "sluiceway_grammar_mask_wait_seconds",
                "Time steps waited for their masks after the model had run.",
                s.grammar_mask_wait_seconds_total,
            ),
        ]
        for name, doc, value in counters:
            yield CounterMetricFamily(name, doc, value=value)


class LatencyHistogram(Collector):
    """A histogram of seconds, exposed as prometheus_client's `Histogram` exposes one
    (`_bucket` by `le`, `_count`, `_sum`; no `_created`), but counted in a plain list.

    The inter-token histogram is observed for every streamed token on the event
    loop, between two decode steps. There `Histogram.observe` (a lock per bucket
    and per sum) took p50 8.6 µs of the ~190 µs the loop spends per token at one
    stream (timestamps in the server, int4, after a step has run through the
    caches); this takes one `bisect`. Not thread-safe: observe and scrape on the
    event loop's thread only, as the server does."""

    def __init__(
        self, name: str, documentation: str, buckets: Iterable[float], registry: CollectorRegistry
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = tuple(sorted(float(b) for b in buckets))
        self._counts = [0] * (len(self._bounds) + 1)  # the last one: above every bound
        self._sum = 0.0
        registry.register(self)

    def observe(self, seconds: float, times: int = 1) -> None:
        """Count `seconds` `times` times (in the first bucket whose bound is at least it)."""
        self._counts[bisect.bisect_left(self._bounds, seconds)] += times
        self._sum += seconds * times

    def collect(self) -> Iterator[Metric]:
        yield self.family(self._name, self._documentation)

    def family(
        self, name: str, documentation: str, labels: dict[str, str] | None = None
    ) -> HistogramMetricFamily:
        """The histogram's counts as one family under `name`, with constant `labels`
        (so the same observations can be exposed under a second name)."""
        labels = labels or {}
        cumulative = list(itertools.accumulate(self._counts))
        buckets = [(floatToGoString(b), c) for b, c in zip(self._bounds, cumulative, strict=False)]
        buckets.append(("+Inf", cumulative[-1]))
        family = HistogramMetricFamily(name, documentation, labels=list(labels))
        family.add_metric(list(labels.values()), buckets, self._sum)
        return family


class Metrics:
    """All of one server's metrics. Recording is cheap (no I/O; a latency observation
    is one `bisect`, with no lock) and happens on the event loop's thread only."""

    def __init__(self, stats: Callable[[], Any], model_name: str | None = None) -> None:
        """With `model_name`, the vLLM-named metrics routers and autoscalers read are
        exposed too (`vllm_metrics`), labelled with it."""
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(stats))
        self.finished = Counter(
            "sluiceway_requests_finished",
            "Choices finished, by reason (stop, length, abort, timeout, error).",
            ["reason"],
            registry=self.registry,
        )
        for reason in FINISH_REASONS:
            self.finished.labels(reason)
        self.ttft = LatencyHistogram(
            "sluiceway_time_to_first_token_seconds",
            "Time from request arrival to a choice's first token.",
            _LATENCY_BUCKETS,
            self.registry,
        )
        self.itl = LatencyHistogram(
            "sluiceway_inter_token_latency_seconds",
            "Time between successive deliveries of tokens to one choice, per token.",
            _LATENCY_BUCKETS,
            self.registry,
        )
        self.e2e = LatencyHistogram(
            "sluiceway_e2e_request_latency_seconds",
            "Time from request arrival to its last byte of output.",
            _LATENCY_BUCKETS,
            self.registry,
        )
        if model_name is not None:
            from sluiceway.api.vllm_metrics import VllmCollector

            self.registry.register(VllmCollector(stats, model_name, self.ttft, self.e2e))

    def record_finish(self, reason: str) -> None:
        self.finished.labels(reason if reason in FINISH_REASONS else "error").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
