"""Lock-free counters, gauges and histograms for one process, exposed exactly as prometheus_client exposes its own.

The proxy runs one asyncio thread per process, so a metric update needs no lock: here it is a float addition (a
histogram: a bisect and a list increment), where prometheus_client's `Counter.inc` / `Histogram.observe` validate
and take a lock per value (a histogram takes two). Each family is a collector on a prometheus_client
`CollectorRegistry`; `collect()` yields the same `Metric` and samples the prometheus_client class of that type
would (`_total` and `_created` for a counter; cumulative `_bucket`, `_count`, `_sum` and `_created` for a
histogram), children in creation order, so `generate_latest` renders the same text (tests/test_local_metrics.py
compares the two). Not thread-safe by design: update them only from the event loop's thread.

With `--workers N` each worker keeps its values here too, and proxy/metrics/files.py copies them into
prometheus_client's multiprocess files for the other workers' scrapes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from prometheus_client import metrics as _prom_metrics
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from proxy.hub.readings import MAX_READINGS, Readings, finite

__all__ = ["CounterChild", "Family", "GaugeChild", "HistogramChild", "LiveGaugeChild", "LocalCounter", "LocalGauge",
           "LocalHistogram", "bucket_index", "count_readings"]


def bucket_index(bounds: list[float], amount: float) -> int:
    """`bisect_left(bounds, amount)`, the index of the first bound >= amount (the bucket prometheus_client counts
    it in), as a loop of float comparisons: compiled, C doubles, where bisect_left makes a rich comparison of two
    float objects a probe (interpreted, bisect_left would be the faster one; both builds run this one)."""
    lo = 0
    hi = len(bounds)
    while lo < hi:
        mid = (lo + hi) >> 1
        if bounds[mid] < amount:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _use_created() -> bool:
    """prometheus_client's switch for `_created` series (PROMETHEUS_DISABLE_CREATED_SERIES, disable_created_metrics)."""
    return bool(getattr(_prom_metrics, "_use_created", True))


class Family:
    """One metric with labels: name, help, type and its children (one per label-value tuple, in creation order)."""

    typ = ""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], _Child] = {}

    @property
    def name(self) -> str:
        return self._name

    @property
    def documentation(self) -> str:
        return self._documentation

    @property
    def labelnames(self) -> tuple[str, ...]:
        return self._labelnames

    def children(self) -> list[tuple[tuple[str, ...], _Child]]:
        """(label values, child) of every child, in creation order."""
        return list(self._children.items())

    def labels(self, *values: str) -> _Child:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self._labelnames):
                raise ValueError(f"{self._name}: expected labels {self._labelnames}, got {values}")
            child = self._children[values] = self._new_child()
        return child

    def _new_child(self) -> _Child:
        raise NotImplementedError

    def describe(self) -> Iterable[Metric]:
        return [Metric(self._name, self._documentation, self.typ)]

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self._name, self._documentation, self.typ)
        created = _use_created()
        names = self._labelnames
        for values, child in list(self._children.items()):
            child.samples(metric, self._name, dict(zip(names, values, strict=True)), created)
        return [metric]


class _Child:
    __slots__ = ()

    def samples(self, metric: Metric, name: str, labels: dict[str, str], created: bool) -> None:
        raise NotImplementedError


class CounterChild(_Child):
    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount

    def samples(self, metric: Metric, name: str, labels: dict[str, str], created: bool) -> None:
        metric.add_sample(name + "_total", labels, self.value)
        if created:
            metric.add_sample(name + "_created", labels, self.created)


class GaugeChild(_Child):
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount

    def dec(self, amount: float = 1) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = float(value)

    def samples(self, metric: Metric, name: str, labels: dict[str, str], created: bool) -> None:
        metric.add_sample(name, labels, self.value)


class LiveGaugeChild(_Child):
    """A gauge whose value is read when a scrape collects it, from state kept elsewhere (a replica's admission
    counts, proxy/gateway/replicas.py): the code that changes that state writes no metric at all. Several readers (label
    values shared by two sources, e.g. upstreams beyond the label cap) are combined with `combine`."""

    __slots__ = ("combine", "reads")

    def __init__(self, read: Callable[[], float], combine: Callable[[Iterable[float]], float] = sum) -> None:
        self.reads = [read]
        self.combine = combine

    @property
    def value(self) -> float:
        reads = self.reads
        return float(reads[0]() if len(reads) == 1 else self.combine(read() for read in reads))

    def samples(self, metric: Metric, name: str, labels: dict[str, str], created: bool) -> None:
        metric.add_sample(name, labels, self.value)


class HistogramChild(_Child):
    """Bucket counts kept per bucket (not cumulative) as prometheus_client keeps them; summed up at collect time."""

    __slots__ = ("bounds", "counts", "created", "le", "sum")

    def __init__(self, bounds: list[float], le: list[str]) -> None:
        self.bounds = bounds
        self.le = le
        self.counts = [0.0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        if amount != amount:  # NaN: prometheus_client adds it to the sum and to no bucket
            self.sum += amount
            return
        bounds = self.bounds  # the first bound >= amount, as prometheus_client
        self.counts[bucket_index(bounds, amount)] += 1
        self.sum += amount

    def observe_readings(self, readings: Readings) -> None:
        """Each value of an upstream's list (read as proxy/hub/readings.py says), as a call of `observe` each: the same
        buckets, the sum added in the same order, the items read in place (`count_readings`)."""
        self.sum = count_readings(self.bounds, self.counts, readings.items, readings.unit, self.sum)

    def observe_many(self, amount: float, n: int) -> None:
        """`n` observations of the same `amount` (as `n` calls of `observe`; the sum may differ in its last bits)."""
        if n <= 0:
            return
        if amount != amount:
            self.sum += amount * n
            return
        bounds = self.bounds
        self.counts[bucket_index(bounds, amount)] += n
        self.sum += amount * n

    def samples(self, metric: Metric, name: str, labels: dict[str, str], created: bool) -> None:
        acc = 0.0
        bucket = name + "_bucket"
        for le, n in zip(self.le, self.counts, strict=True):
            acc += n
            metric.add_sample(bucket, {**labels, "le": le}, acc)
        metric.add_sample(name + "_count", labels, acc)
        if self.bounds[0] >= 0:
            metric.add_sample(name + "_sum", labels, self.sum)
        if created:
            metric.add_sample(name + "_created", labels, self.created)


_INF: Final = math.inf


def count_readings(bounds: list[float], counts: list[Any], items: list[Any], unit: float, total: float) -> float:
    """Read an upstream's list into a histogram's bucket counts (proxy/hub/readings.py: the finite non-negative numbers
    among the first MAX_READINGS items, times `unit`) and return `total` plus each value in order. One pass of C
    doubles, no float object made: each value first tried in the previous one's bucket (an upstream's per-token
    timings cluster: one decode step after another), a run of values in one bucket added to its count at once."""
    b = -1
    run = 0
    low = high = 0.0  # the current bucket is (low, high]
    if len(items) > MAX_READINGS:
        items = items[:MAX_READINGS]
    for item in items:
        v = finite(item)
        if v < 0.0:
            continue
        v *= unit
        total += v
        if b >= 0 and low < v <= high:
            run += 1
            continue
        if run:
            counts[b] += run
        b = bucket_index(bounds, v)
        low = bounds[b - 1] if b else -_INF
        high = bounds[b]
        run = 1
    if run:
        counts[b] += run
    return total


class LocalCounter(Family):
    typ = "counter"

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        super().__init__(name.removesuffix("_total"), documentation, labelnames)

    def _new_child(self) -> CounterChild:
        return CounterChild()


class LocalGauge(Family):
    typ = "gauge"

    def _new_child(self) -> GaugeChild:
        return GaugeChild()

    def live(self, values: tuple[str, ...], read: Callable[[], float],
             combine: Callable[[Iterable[float]], float] = sum) -> LiveGaugeChild:
        """Make the child for `values` a LiveGaugeChild reading `read()` at scrape time (in the place of the child
        of that name, if there was one: the series keep their order). A second reader for the same values is
        combined with the first."""
        old = self._children.get(values)
        if isinstance(old, LiveGaugeChild):
            old.reads.append(read)
            return old
        child = LiveGaugeChild(read, combine)
        self.labels(*values)  # checks the label count; a new name takes its place in creation order
        self._children[values] = child
        return child


class LocalHistogram(Family):
    typ = "histogram"

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]) -> None:
        super().__init__(name, documentation, labelnames)
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError("Buckets not in sorted order")
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        self._bounds = bounds
        self._le = [floatToGoString(b) for b in bounds]  # type: ignore[no-untyped-call]

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self._bounds, self._le)

