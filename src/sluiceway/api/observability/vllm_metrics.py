"""The metrics routers and autoscalers written for vLLM read, under vLLM's names.

Same meanings as vLLM's (`vllm/v1/metrics/loggers.py`), each labelled
`model_name`: requests running and waiting (here: choices, which vLLM also
schedules as separate requests), the fraction of KV blocks in use (cached but
unused blocks count as free, as there), prefix-cache lookups and hits in tokens,
prompt and generated token totals, preemptions, and the time-to-first-token and
end-to-end latency histograms (the same observations as the `sluiceway_` ones).
Read at scrape time from `engine.stats()`, like the `sluiceway_` gauges.
Where LoRA adapters are served, `vllm:lora_requests_info` too: one sample whose
labels name the adapters running and waiting (comma-separated) and `max_lora`,
valued at the scrape's time, as the Gateway API Inference Extension reads it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluiceway.api.observability.latency_histogram import LatencyHistogram

LABEL = "model_name"


class VllmCollector(Collector):
    def __init__(
        self,
        stats: Callable[[], Any],
        model_name: str,
        ttft: LatencyHistogram,
        e2e: LatencyHistogram,
    ) -> None:
        self._stats = stats
        self._labels = {LABEL: model_name}
        self._ttft = ttft
        self._e2e = e2e

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        if s.max_lora:
            family = GaugeMetricFamily(
                "vllm:lora_requests_info",
                "Running stats on lora requests.",
                labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
            )
            family.add_metric(
                [
                    str(s.max_lora),
                    ",".join(s.waiting_lora_adapters),
                    ",".join(s.running_lora_adapters),
                ],
                time.time(),
            )
            yield family
        total = s.kv_blocks_total
        gauges = [
            (
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                s.num_running_seqs,
            ),
            (
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                s.num_waiting_seqs,
            ),
            (
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                s.kv_blocks_used / total if total else 0.0,
            ),
        ]
        for name, doc, value in gauges:
            family = GaugeMetricFamily(name, doc, labels=[LABEL])
            family.add_metric([self._labels[LABEL]], value)
            yield family
        counters = [
            (
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                s.prefix_cache_queries_total,
            ),
            (
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.",
                s.prefix_cache_hits_total,
            ),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens_total),
            (
                "vllm:generation_tokens",
                "Number of generation tokens processed.",
                s.generation_tokens_total,
            ),
            (
                "vllm:num_preemptions",
                "Cumulative number of preemption from the engine.",
                s.num_preemptions_total,
            ),
        ]
        for name, doc, value in counters:
            counter = CounterMetricFamily(name, doc, labels=[LABEL])
            counter.add_metric([self._labels[LABEL]], value)
            yield counter
        yield self._ttft.family(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            self._labels,
        )
        yield self._e2e.family(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            self._labels,
        )
