"""`LatencyHistogram` exposes exactly what prometheus_client's `Histogram` does."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from sluiceway.api.observability.latency_histogram import LatencyHistogram
from sluiceway.api.observability.metrics import _LATENCY_BUCKETS

NAME = "sluiceway_test_latency_seconds"


def _samples(registry: CollectorRegistry) -> dict[str, float]:
    """Every sample line but `_created` (which prometheus_client's Histogram adds), with
    the HELP and TYPE lines kept as keys."""
    samples = {}
    for line in generate_latest(registry).decode().splitlines():
        if "_created" in line:
            continue
        if line.startswith("#"):
            samples[line] = 0.0
        else:
            key, value = line.rsplit(" ", 1)
            samples[key] = float(value)
    return samples


# Values on and next to every bound, below the first and above the last: where a
# bucket search can go wrong by one.
_EDGES = [b for bound in _LATENCY_BUCKETS for b in (bound * 0.999, bound, bound * 1.001)]
_SECONDS = st.one_of(
    st.sampled_from([0.0, *_EDGES, 1000.0]),
    st.floats(min_value=0.0, max_value=100.0, allow_nan=False),
)


@given(st.lists(st.tuples(_SECONDS, st.integers(min_value=1, max_value=4)), max_size=40))
def test_same_exposition_as_prometheus_histogram(observations: list[tuple[float, int]]) -> None:
    ours_registry, theirs_registry = CollectorRegistry(), CollectorRegistry()
    ours = LatencyHistogram(NAME, "Seconds.", _LATENCY_BUCKETS, ours_registry)
    theirs = Histogram(NAME, "Seconds.", buckets=_LATENCY_BUCKETS, registry=theirs_registry)
    for seconds, times in observations:
        ours.observe(seconds, times)
        for _ in range(times):
            theirs.observe(seconds)
    ours_samples, theirs_samples = _samples(ours_registry), _samples(theirs_registry)
    # A value counted n times adds n * value to the sum, where prometheus_client adds
    # it n times over: the float sums may differ in the last bits.
    total = f"{NAME}_sum"
    assert math.isclose(ours_samples.pop(total), theirs_samples.pop(total), rel_tol=1e-12)
    assert ours_samples == theirs_samples


def test_counts_land_in_their_buckets() -> None:
    registry = CollectorRegistry()
    histogram = LatencyHistogram(NAME, "Seconds.", (0.1, 1.0), registry)
    histogram.observe(0.1)  # on a bound: that bucket
    histogram.observe(0.5, 3)
    histogram.observe(7.0)  # above every bound: only +Inf
    text = generate_latest(registry).decode()
    assert f'{NAME}_bucket{{le="0.1"}} 1.0' in text
    assert f'{NAME}_bucket{{le="1.0"}} 4.0' in text
    assert f'{NAME}_bucket{{le="+Inf"}} 5.0' in text
    assert f"{NAME}_count 5.0" in text
    assert f"{NAME}_sum 8.6" in text
