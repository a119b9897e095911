"""A latency histogram that the server's metrics and their vLLM-named copies
(`metrics.py`, `vllm_metrics.py`) both expose."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString


class LatencyHistogram(Collector):
    """A histogram of seconds, exposed as prometheus_client's `Histogram` exposes one
    (`_bucket` by `le`, `_count`, `_sum`; no `_created`), but counted in a plain list.

    The inter-token histogram is observed for every streamed token on the event
    loop, between two decode steps, where `Histogram.observe` (a lock per bucket
    and per sum) was a visible share of the loop's work per token
    (`docs/benchmarks.md`); this takes one `bisect`. Not thread-safe: observe and
    scrape on the event loop's thread only, as the server does."""

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
