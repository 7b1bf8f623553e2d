"""Histogram samples taken in batches give exactly what one `observe` per sample gives: an upstream's per-token list
read into a histogram (`HistogramChild.observe_readings`, proxy/hub/readings.py), the zeros of one
read's later tokens (`observe_many`), and the list that reading makes (`values`: one pass for plain numbers)."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.dialects import mindie
from proxy.hub.readings import MAX_READINGS, Readings
from proxy.hub.readings import values as read_values
from proxy.metrics import definitions as metrics_mod
from proxy.metrics.local import LocalHistogram

BOUNDS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0)

# Values that land exactly on bounds, between them, beyond the last one, and the odd ones observe() must take.
amount = st.one_of(
    st.sampled_from([*BOUNDS, 0.0, -0.0, 1e9, math.inf, -1.0]),
    st.floats(min_value=0, max_value=10, allow_nan=False),
    st.integers(min_value=0, max_value=100),
)
with_nan = st.one_of(amount, st.just(math.nan))


def local_child() -> Any:
    return LocalHistogram("h", "", ["l"], BOUNDS).labels("x")


def state(child: Any) -> tuple[list[float], float]:
    return list(child.counts), child.sum


def scaled_reference(items: list[Any], unit: float) -> list[float]:
    """One item at a time: the finite non-negative numbers (not bools) among the first MAX_READINGS, times `unit`."""
    out = []
    for item in items[:MAX_READINGS]:
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            continue
        f = float(item)
        if math.isfinite(f) and f >= 0:
            out.append(f * unit)
    return out


item = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.booleans(), st.none(), st.text(max_size=3),
)
plain = st.one_of(st.floats(min_value=0, max_value=1e6), st.integers(min_value=0, max_value=10**6))
clustered = st.lists(st.sampled_from([20, 21, 50, 0, 10**12, 0.5, 1, 5, 10, 100]), max_size=60)  # runs in one bucket
UNITS = st.sampled_from([1.0, mindie.DECODE_TIME_UNIT, mindie.QUEUE_WAIT_TIME_UNIT])
MIXED = [3, True, None, "4", -1, float("nan"), float("inf"), 2**70, 7.25, [], {"a": 1}, 0.5]


@settings(max_examples=300, deadline=None)
@given(before=st.lists(amount, max_size=5),
       batch=st.one_of(st.lists(item, max_size=60), st.lists(plain, max_size=60), clustered),
       unit=UNITS)
def test_observe_readings_equals_observe_each_value(before: list[float], batch: list[Any], unit: float) -> None:
    """`observe_readings` counts and sums what one `observe` per finite non-negative number times the unit gives, in
    order."""
    check_observe_readings(before, batch, unit)


def check_observe_readings(before: list[float], batch: list[Any], unit: float) -> None:
    one, each = local_child(), local_child()
    for child in (one, each):
        for a in before:
            child.observe(a)
    one.observe_readings(Readings(batch, unit))
    for a in scaled_reference(batch, unit):
        each.observe(a)
    counts, total = state(one)
    want_counts, want_total = state(each)
    assert counts == want_counts
    assert total == want_total or (math.isnan(total) and math.isnan(want_total))


def test_a_mixed_list_is_read_as_its_numbers() -> None:
    """Bools, None, strings, negatives, NaN, infinity and containers are left out; a huge integer is a number."""
    for unit in (1.0, 1e-3, 1e-6):
        want = [3 * unit, 2**70 * unit, 7.25 * unit, 0.5 * unit]
        assert read_values(Readings(MIXED, unit)) == want
        check_observe_readings([], MIXED, unit)


def test_only_the_first_max_readings_items_are_read() -> None:
    items = [1.0] * (MAX_READINGS + 10)
    assert len(read_values(Readings(items))) == MAX_READINGS
    child = local_child()
    child.observe_readings(Readings(items))
    assert sum(child.counts) == MAX_READINGS


@settings(max_examples=200, deadline=None)
@given(value=amount, n=st.integers(min_value=0, max_value=50))
def test_observe_many_equals_observe_each(value: float, n: int) -> None:
    many, each = local_child(), local_child()
    many.observe_many(value, n)
    for _ in range(n):
        each.observe(value)
    assert many.counts == each.counts
    assert many.sum == each.sum or math.isclose(many.sum, each.sum)  # n additions vs one product


@settings(max_examples=400, deadline=None)
@given(items=st.one_of(st.lists(item, max_size=30), st.lists(plain, max_size=30)), unit=UNITS)
def test_read_values_equals_item_by_item(items: list[Any], unit: float) -> None:
    got = read_values(Readings(items, unit))
    want = scaled_reference(items, unit)
    assert got == want
    assert all(type(v) is float for v in got)


def test_mindie_timings_of_a_long_answer_reach_the_histograms() -> None:
    """A 2,000-token MindIE answer: every per-token value is counted, in the right buckets, once."""
    n = 2000
    decode_ms = [float(i % 50) for i in range(n)]
    timings = mindie.MindIEDialect().timings({"prefill_time": 120, "decode_time_arr": decode_ms,
                                             "usage": {"batch_size": [3] * n, "queue_wait_time": [250] * n}})
    assert timings is not None
    for local in (True, False):
        m = metrics_mod.Metrics(["m"], local=local)
        obs = m.request("/v1/chat/completions", "u", "m", True)
        obs.upstream_timings(timings)
        obs.finish(200, False, "stop")
        reg = m.registry
        labels = {"upstream": "u", "model": "m"}
        decode = "dialect_proxy_upstream_decode_token_seconds"
        assert reg.get_sample_value(decode + "_count", labels) == n
        assert reg.get_sample_value(decode + "_sum", labels) == sum(v * mindie.DECODE_TIME_UNIT for v in decode_ms)
        assert reg.get_sample_value("dialect_proxy_upstream_batch_size_count", labels) == n
        assert reg.get_sample_value("dialect_proxy_upstream_queue_wait_seconds_count", labels) == n
