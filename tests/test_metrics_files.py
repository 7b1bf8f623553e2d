"""proxy/metrics/files.py: after any mix of updates and flushes, a FileMirror's prometheus_client twins expose
exactly the local values they mirror (counters, histograms with NaN and out-of-range samples, gauges set, moved and
read at flush time), and a flush with nothing changed writes no counter or histogram value again.

In this process prometheus_client keeps its values in memory (no PROMETHEUS_MULTIPROC_DIR at import); the writes
are the same calls as to the files. tests/test_metrics.py runs the files themselves across worker processes,
tests/test_workers.py `serve --workers 2`."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.hub.readings import Readings
from proxy.metrics.files import FileMirror
from proxy.metrics.local import LocalCounter, LocalGauge, LocalHistogram

BOUNDS = (0.001, 0.01, 0.1, 1.0, 10.0)
LABELS = ("a", "b")

amount = st.one_of(st.sampled_from([*BOUNDS, 0.0, 1e9, math.inf, math.nan]), st.floats(0, 20, allow_nan=False))
op = st.one_of(
    st.tuples(st.just("inc"), st.sampled_from(LABELS), st.floats(0, 100, allow_nan=False)),
    st.tuples(st.just("observe"), st.sampled_from(LABELS), amount),
    st.tuples(st.just("observe_many"), st.sampled_from(LABELS), amount, st.integers(0, 5)),
    st.tuples(st.just("observe_readings"), st.sampled_from(LABELS), st.lists(amount, max_size=8)),
    st.tuples(st.just("gauge"), st.sampled_from(LABELS), st.floats(-50, 50, allow_nan=False)),
    st.tuples(st.just("live"), st.floats(0, 9, allow_nan=False)),
    st.just(("flush",)),
)


def samples(collected: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for metric in collected for s in metric.samples if not s.name.endswith("_created")}


def same(a: dict[Any, float], b: dict[Any, float]) -> bool:
    return a.keys() == b.keys() and all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)


def mirrored() -> tuple[FileMirror, LocalCounter, LocalHistogram, LocalGauge, dict[str, float]]:
    mirror = FileMirror()
    counter = LocalCounter("c_total", "a counter", ["l"])
    histogram = LocalHistogram("h", "a histogram", ["l"], BOUNDS)
    gauge = LocalGauge("g", "a gauge", ["l"])
    mirror.add(counter, None, "")
    mirror.add(histogram, BOUNDS, "")
    mirror.add(gauge, None, "livesum")
    state = {"live": 0.0}
    gauge.live(("live",), lambda: state["live"])
    return mirror, counter, histogram, gauge, state


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(op, max_size=40))
def test_twins_expose_the_local_values_after_a_flush(ops: list[tuple[Any, ...]]) -> None:
    mirror, counter, histogram, gauge, state = mirrored()
    for o in ops:
        if o[0] == "inc":
            counter.labels(o[1]).inc(o[2])
        elif o[0] == "observe":
            histogram.labels(o[1]).observe(o[2])
        elif o[0] == "observe_many":
            histogram.labels(o[1]).observe_many(o[2], o[3])
        elif o[0] == "observe_readings":
            histogram.labels(o[1]).observe_readings(Readings(o[2]))
        elif o[0] == "gauge":
            gauge.labels(o[1]).set(o[2])
        elif o[0] == "live":
            state["live"] = o[1]
        else:
            mirror.flush()
    mirror.flush()
    for family, twin, _ in mirror._families:
        assert same(samples(twin.collect()), samples(family.collect())), family.name


def test_an_unchanged_value_is_not_written_again() -> None:
    mirror, counter, histogram, gauge, state = mirrored()
    counter.labels("a").inc(2)
    histogram.labels("a").observe(0.05)
    gauge.labels("a").set(3)
    mirror.flush()
    twins = {family.name: twin for family, twin, _ in mirror._families}
    writes: list[str] = []

    class Spy:
        def __init__(self, name: str, value: Any) -> None:
            self.name, self.value = name, value

        def set(self, v: float) -> None:
            writes.append(self.name)
            self.value.set(v)

        def get(self) -> float:
            return float(self.value.get())

    c, h = twins["c"].labels("a"), twins["h"].labels("a")
    c._value = Spy("counter", c._value)
    h._sum = Spy("sum", h._sum)
    h._buckets = [Spy(f"bucket {i}", b) for i, b in enumerate(h._buckets)]
    mirror.flush()
    assert writes == []  # nothing changed
    counter.labels("a").inc(1)
    histogram.labels("a").observe(5.0)  # bucket le=10
    mirror.flush()
    assert writes == ["counter", "bucket 4", "sum"]
    assert twins["c"].labels("a")._value.get() == 3
    state["live"] = 7.0
    mirror.flush()  # a gauge is written at every flush: the live one reads 7 now
    assert samples(twins["g"].collect())[("g", (("l", "live"),))] == 7.0


def test_a_gauge_child_replaced_by_a_live_one_keeps_its_series() -> None:
    """A replica's gauge first set, then read from the replica's state (LocalGauge.live puts a new child in place
    of the old one): the files get the live value under the same labels, one series."""
    mirror, counter, histogram, gauge, state = mirrored()
    gauge.labels("r").set(2)
    mirror.flush()
    gauge.live(("r",), lambda: 5.0)
    mirror.flush()
    twin = next(t for f, t, _ in mirror._families if f.name == "g")
    got = samples(twin.collect())
    assert got[("g", (("l", "r"),))] == 5.0
    assert samples(gauge.collect()) == got


def test_a_failing_write_is_logged_and_the_writes_go_on(monkeypatch: Any, caplog: Any) -> None:
    """The worker's periodic write (proxy/server/appstate.py) logs a failure and tries again at the next interval."""
    import asyncio
    from types import SimpleNamespace

    from proxy.server import appstate

    calls: list[int] = []

    class Failing:
        def flush_files(self) -> None:
            calls.append(1)
            raise RuntimeError("prometheus_client changed")

    monkeypatch.setattr(appstate, "FLUSH_INTERVAL", 0.01)

    async def run() -> None:
        state: Any = SimpleNamespace(metrics=Failing())  # what _flush_metrics reads of an AppState
        task = asyncio.create_task(appstate.AppState._flush_metrics(state))
        for _ in range(300):  # bounded: ~3 s at most
            await asyncio.sleep(0.01)
            if len(calls) >= 3:
                break
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    with caplog.at_level("ERROR", logger="dialect_proxy"):
        asyncio.run(run())
    assert len(calls) >= 3
    assert "multiprocess files failed" in caplog.text and "prometheus_client changed" in caplog.text
