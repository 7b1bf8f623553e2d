"""Multiprocess mode (`serve --workers N`): a worker's metric values copied into prometheus_client's files.

Every worker keeps its metrics in proxy/metrics/local.py's lock-free objects, as a single process does; a
`FileMirror` writes their values into prometheus_client's multiprocess files (mmap files per worker process in
PROMETHEUS_MULTIPROC_DIR), from which any worker's /metrics merges every worker's values (prometheus_client's
MultiProcessCollector, proxy/metrics/definitions.py `Metrics.render`). A request's metric updates are float additions
instead of a lock and an mmap write each; the files get each changed value once per flush. A worker flushes before it
renders /metrics, every FLUSH_INTERVAL seconds (proxy/server/appstate.py) and when it stops: a scrape shows the other
workers' values as they were at most FLUSH_INTERVAL ago, its own as they are.

Counters and histograms are written when they changed, gauges at every flush (a `mostrecent` gauge's timestamp is
that of the flush: the newest worker's view wins, as when each worker wrote its own at every change). Values are
written whole (`set`), never as increments, so the files hold exactly the local values. Counter and histogram
children have no public setter: this reaches into prometheus_client's child objects (a counter's `_value`, a
histogram's `_buckets` and `_sum`), checks that they are there when it first writes a child, and says so in a
RuntimeError (which /metrics answers with a 500 and the periodic write logs) if they are not.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from prometheus_client import Counter as PromCounter
from prometheus_client import Gauge as PromGauge
from prometheus_client import Histogram as PromHistogram

from proxy.metrics.local import (
    CounterChild,
    Family,
    GaugeChild,
    HistogramChild,
    LiveGaugeChild,
    LocalCounter,
    LocalGauge,
    LocalHistogram,
)

__all__ = ["FLUSH_INTERVAL", "FileMirror"]

FLUSH_INTERVAL: Final = 1.0  # seconds between a worker's flushes (proxy/server/appstate.py)


class FileMirror:
    """The prometheus_client twins (values in the multiprocess files) of a Metrics object's local families."""

    def __init__(self) -> None:
        # each local family, its twin, and per label values [the twin's child, what was last written to it]
        # (by label values, not by child: a gauge's child may be replaced by a live one, LocalGauge.live)
        self._families: list[tuple[Family, Any, dict[tuple[str, ...], list[Any]]]] = []

    def add(self, family: Family, buckets: Iterable[float] | None, multiprocess_mode: str) -> None:
        """Give `family` (just made by proxy/metrics/definitions.py) a twin writing to the files."""
        name, doc, labels = family.name, family.documentation, family.labelnames
        if isinstance(family, LocalCounter):
            twin: Any = PromCounter(name, doc, labels, registry=None)
        elif isinstance(family, LocalHistogram):
            twin = PromHistogram(name, doc, labels, registry=None, buckets=list(buckets or ()))
        elif isinstance(family, LocalGauge):
            # one of prometheus_client's modes, as proxy/metrics/definitions.py names them
            mode: Any = multiprocess_mode or "all"
            twin = PromGauge(name, doc, labels, registry=None, multiprocess_mode=mode)
        else:
            raise TypeError(f"no prometheus_client twin for {type(family).__name__}")
        self._families.append((family, twin, {}))

    def flush(self) -> None:
        """Write every local value that the files do not hold yet. Event loop thread only, as the updates."""
        for family, twin, written in self._families:
            for values, child in family.children():
                entry = written.get(values)
                if entry is None:
                    entry = written[values] = [_twin_child(twin, values, child), None]
                target, last = entry
                if isinstance(child, CounterChild):
                    if child.value != last:
                        target._value.set(child.value)
                        entry[1] = child.value
                elif isinstance(child, HistogramChild):
                    if last is None or child.sum != last[0] or child.counts != last[1]:
                        previous = last[1] if last is not None else [0.0] * len(child.counts)
                        for i, n in enumerate(child.counts):
                            if n != previous[i]:
                                target._buckets[i].set(n)
                        target._sum.set(child.sum)
                        entry[1] = (child.sum, list(child.counts))
                elif isinstance(child, (GaugeChild, LiveGaugeChild)):  # a LiveGaugeChild reads its value now
                    target.set(child.value)


def _twin_child(twin: Any, values: tuple[str, ...], child: Any) -> Any:
    """`twin.labels(*values)`, checked for the private attributes `flush` writes through."""
    target = twin.labels(*values)
    if isinstance(child, CounterChild):
        ok = hasattr(getattr(target, "_value", None), "set")
    elif isinstance(child, HistogramChild):
        buckets = getattr(target, "_buckets", None)
        ok = (isinstance(buckets, list) and len(buckets) == len(child.counts)
              and all(hasattr(b, "set") for b in buckets) and hasattr(getattr(target, "_sum", None), "set"))
    else:
        ok = hasattr(target, "set")
    if not ok:
        raise RuntimeError(f"this prometheus_client's {twin._type} children are not what proxy/metrics/files.py "
                           "writes through (a counter's _value, a histogram's _buckets and _sum)")
    return target
