"""Prometheus metrics with their own registry (one per app, so tests can run many apps).

Engine-side numbers (running/waiting sequences, KV blocks, token and preemption
totals) are read from `engine.stats()` at scrape time by a custom collector, so
the engine keeps no prometheus dependency and the counters can never drift from
its own totals. Per-request timings and finish reasons are recorded by the API.
`sluiceway_requests_finished_total{reason}` counts choices (sequences), like
`sluiceway_requests_running`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluiceway.api.observability.latency_histogram import LatencyHistogram

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
            from sluiceway.api.observability.vllm_metrics import VllmCollector

            self.registry.register(VllmCollector(stats, model_name, self.ttft, self.e2e))

    def record_finish(self, reason: str) -> None:
        self.finished.labels(reason if reason in FINISH_REASONS else "error").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
