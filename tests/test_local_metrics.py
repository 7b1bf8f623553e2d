"""proxy/metrics/local.py: the lock-free families render what prometheus_client's classes render, and a scrape shows
live values (in-flight requests, token latencies mid-stream, replica admission gauges)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from proxy.dialects import get_dialect
from proxy.gateway.redact import Redactor
from proxy.gateway.replicas import ReplicaSet
from proxy.metrics.definitions import Metrics
from proxy.metrics.local import LocalCounter, LocalGauge, LocalHistogram
from proxy.settings import ReplicaSettings, ServerSettings, UpstreamSettings
from tests.test_metrics import CONFIGURED, ROUTE, FakeClock, clock, promtool_check_metrics, run_script, value

__all__ = ["clock"]  # the fixture, imported for the tests below

CREATED = re.compile(r"^(\S+_created(?:\{.*\})?) \S+$", re.MULTILINE)
QUEUE_WAIT = re.compile(r"^(dialect_proxy_replica_queue_wait_seconds_\S+) \S+$")


def normalized(m: Metrics) -> str:
    """The exposition with the `_created` timestamps (wall-clock times of creation) blanked out."""
    return CREATED.sub(r"\1 T", m.render()[0].decode())


def extra_script(m: Metrics) -> None:
    """Series the scripted requests do not touch: gateway families, continuity, odd values."""
    for replica in ("0", "1"):
        m.child(m.upstream_attempts, "r1", replica, "ok").inc(3)
        m.child(m.replica_in_flight, "r1", replica).set(2)
        m.child(m.replica_in_flight, "r1", replica).dec()
        m.child(m.replica_queue_length, "r1", replica).set(0)
        m.child(m.replica_queue_wait, "r1", replica).observe(0.25)
        m.child(m.replica_queue_wait, "r1", replica).observe(1e9)  # beyond the last bound: +Inf only
        m.child(m.replica_up, "r1", replica).set(True)
    m.child(m.retries, "r1", "unavailable").inc()
    m.child(m.admission_rejections, "r1", "queue_full").inc(2.5)
    m.reasoning_continuity("r1", "restored", 3)
    m.reasoning_continuity("r1", "nonsense")
    m.request(ROUTE, "r1", "gpt-4o", stream=True)  # left in flight
    m.request(ROUTE, "r1", "gpt-4o", stream=False)  # left in flight


def test_exposition_equals_prometheus_client(clock: FakeClock) -> None:
    local, reference = Metrics(CONFIGURED), Metrics(CONFIGURED, local=False)
    assert isinstance(local.requests, LocalCounter) and isinstance(local.in_flight_requests, LocalGauge)
    assert isinstance(local.request_duration, LocalHistogram)
    assert not isinstance(reference.requests, LocalCounter)
    for m in (local, reference):
        clock.t = 1000.0
        run_script(m, clock)
        extra_script(m)
    text = normalized(local)
    assert text == normalized(reference)
    assert "_created" not in local.render()[0].decode()  # proxy/metrics/definitions.py turns prometheus_client's off
    assert 'dialect_proxy_replica_queue_wait_seconds_bucket{le="+Inf",replica="0",upstream="r1"} 2.0' in text
    promtool_check_metrics(local.render()[0])
    # the registry answers sample queries for the local families, too
    assert value(local, "dialect_proxy_in_flight_requests", route=ROUTE, upstream="r1", model="gpt-4o") == 2
    assert value(local, "dialect_proxy_admission_rejections_total", upstream="r1", reason="queue_full") == 2.5


def test_local_families_check_their_input() -> None:
    m = Metrics(CONFIGURED)
    with pytest.raises(ValueError, match="non-negative"):
        m.child(m.requests, ROUTE, "r1", "gpt-4o", "false", "2xx", "ok").inc(-1)
    with pytest.raises(ValueError, match="expected labels"):
        m.requests.labels("too", "few")
    with pytest.raises(ValueError, match="sorted"):
        LocalHistogram("h", "", [], [2.0, 1.0])


def test_scrape_shows_live_values_mid_stream(clock: FakeClock) -> None:
    m = Metrics(CONFIGURED)
    obs = m.request(ROUTE, "r1", "gpt-4o", stream=True)
    lab = {"route": ROUTE, "upstream": "r1", "model": "gpt-4o"}
    assert value(m, "dialect_proxy_in_flight_streams", **lab) == 1
    obs.chunk(True)
    for _ in range(3):
        clock.at(clock.t + 0.125)
        obs.chunk(True)
    # no batching in one process: every token latency is in the very next scrape
    assert value(m, "dialect_proxy_inter_token_latency_seconds_count", **lab) == 3
    assert value(m, "dialect_proxy_inter_token_latency_seconds_sum", **lab) == pytest.approx(0.375)
    assert value(m, "dialect_proxy_time_to_first_token_seconds_count", **lab) == 1
    obs.finish(200, False, "stop")
    assert value(m, "dialect_proxy_in_flight_streams", **lab) == 0
    assert value(m, "dialect_proxy_inter_token_latency_seconds_count", **lab) == 3


def test_replica_gauges_follow_admission() -> None:
    """Gauges set only when their value changes still show every state a scrape can see."""
    m = Metrics(CONFIGURED)
    upstream = UpstreamSettings(name="r1", dialect="openai", url="http://127.0.0.1:1", max_in_flight=1,
                                queue_size=1, replicas=(ReplicaSettings("a", "http://127.0.0.1:1"),))
    rset = ReplicaSet(upstream, ServerSettings(), get_dialect("openai"), m, Redactor())
    lab = {"upstream": "r1", "replica": "a"}

    def gauges() -> tuple[float, float, float]:
        return (value(m, "dialect_proxy_replica_in_flight", **lab),
                value(m, "dialect_proxy_replica_queue_length", **lab), value(m, "dialect_proxy_replica_up", **lab))

    async def scenario() -> None:
        assert gauges() == (0, 0, 1)
        first = await rset.attempts({}).next()
        assert gauges() == (1, 0, 1)
        waiting = asyncio.create_task(rset.attempts({}).next())
        for _ in range(100):
            await asyncio.sleep(0)
            if gauges()[1]:
                break
        assert gauges() == (1, 1, 1)
        first.release()
        second = await asyncio.wait_for(waiting, 10)
        assert gauges() == (1, 0, 1)  # the slot went straight to the waiter
        rset.succeeded(second.replica)
        second.release()
        assert gauges() == (0, 0, 1)
        rset.replicas[0].healthy = False
        rset.failed(rset.replicas[0], "unreachable")
        assert gauges() == (0, 0, 0)
        await rset.close()

    asyncio.run(scenario())
    names = {s.name for f in text_string_to_metric_families(m.render()[0].decode()) for s in f.samples}
    assert {"dialect_proxy_replica_in_flight", "dialect_proxy_replica_queue_length"} <= names


class _Gateway:
    """Two upstreams' replica sets on one Metrics: `gw` three replicas with admission and a short outlier backoff,
    `solo` one unlimited replica (the common case)."""

    def __init__(self, m: Metrics) -> None:
        self.m = m
        three = tuple(ReplicaSettings(n, f"http://127.0.0.1:{i + 1}") for i, n in enumerate(("x", "y", "z")))
        gw = UpstreamSettings(name="gw", dialect="openai", url=three[0].url, replicas=three, max_in_flight=1,
                              queue_size=2, queue_timeout=30, outlier_failures=1, outlier_backoff=0.2,
                              health_interval=0)
        solo = UpstreamSettings(name="solo", dialect="openai", url="http://127.0.0.1:9")
        self.gw = ReplicaSet(gw, ServerSettings(), get_dialect("openai"), m, Redactor())
        self.solo = ReplicaSet(solo, ServerSettings(), get_dialect("openai"), m, Redactor())

    async def on(self, index: int) -> Any:
        """A ticket on replica `index` of gw (the others count as tried), waiting in its queue if need be."""
        return await self.gw.acquire(None, tuple(i for i in range(3) if i != index))

    async def close(self) -> None:
        await self.gw.close()
        await self.solo.close()


def test_replica_gauges_read_at_scrape_equal_prometheus_client_function_gauges() -> None:
    """The replica gauges are read from the admission and health state when a scrape collects them, by the local
    gauges and by prometheus_client's (`local=False`, their `set_function`). At every moment that matters both
    expositions are the same, line for line: the series appear when a replica is first used and in that order, and
    show what is in flight, what is queued and who is up."""
    local, reference = _Gateway(Metrics(CONFIGURED)), _Gateway(Metrics(CONFIGURED, local=False))
    assert isinstance(local.m.replica_in_flight, LocalGauge)
    assert not isinstance(reference.m.replica_in_flight, LocalGauge)
    worlds = (local, reference)
    moments = 0

    def same(**expect: float) -> None:
        """Both expositions equal; and `name__replica` = value in them (upstream gw; replica `solo` for solo)."""
        nonlocal moments
        moments += 1
        assert gauge_lines(local.m) == gauge_lines(reference.m), f"moment {moments}"
        for key, want in expect.items():
            name, replica = key.split("__")
            labels = {"upstream": "solo", "replica": "0"} if replica == "solo" else {"upstream": "gw",
                                                                                     "replica": replica}
            assert value(local.m, f"dialect_proxy_replica_{name}", **labels) == want, (key, moments)

    def gauge_lines(m: Metrics) -> list[str]:
        """The exposition, line by line; the time waited in a queue (wall time, not the same twice) blanked."""
        return [QUEUE_WAIT.sub(r"\1 T", line) for line in normalized(m).splitlines()]

    def series(m: Metrics, name: str) -> list[str]:
        return [line.split("{", 1)[1] for line in normalized(m).splitlines()
                if line.startswith(f"dialect_proxy_replica_{name}{{")]

    async def queued(at: int, n: int) -> None:
        """Until replica `at` has `n` requests in its queue in both worlds (bounded)."""
        for _ in range(100):
            await asyncio.sleep(0)
            if all(w.gw.replicas[at].admission.queued == n for w in worlds):
                break

    async def scenario() -> None:
        same(up__x=1, up__y=1, up__z=1, up__solo=1)
        assert series(local.m, "in_flight") == []  # nothing used yet: no in_flight / queue_length series
        # z is used first, then the lone replica: the series come in that order
        held = [await w.on(2) for w in worlds]
        same(in_flight__z=1, queue_length__z=0, up__z=1)
        assert series(local.m, "in_flight") == ['replica="z",upstream="gw"} 1.0']
        solo = [w.solo.attempts({}) for w in worlds]
        solo_tickets = [await a.next() for a in solo]
        same(in_flight__solo=1, in_flight__z=1)
        # two more for z wait in its queue
        waiting = [asyncio.create_task(w.on(2)) for w in worlds for _ in range(2)]
        await queued(2, 2)
        same(in_flight__z=1, queue_length__z=2)
        # x fails once (outlier_failures 1): ejected, its first use
        for w in worlds:
            w.gw.failed(w.gw.replicas[0], "unreachable")
        same(up__x=0, in_flight__x=0, in_flight__z=1, queue_length__z=2)
        assert value(local.m, "dialect_proxy_replica_ejections_total", upstream="gw", replica="x") == 1
        # z's slot goes to the first in line, then to the second
        for t in held:
            t.release()
        await asyncio.sleep(0)
        same(in_flight__z=1, queue_length__z=1)
        firsts = [await waiting[0], await waiting[2]]
        for t in firsts:
            t.release()
        seconds = [await waiting[1], await waiting[3]]
        same(in_flight__z=1, queue_length__z=0)
        for a, t in zip(solo, solo_tickets, strict=True):
            a.succeeded(t)
            t.release()
        for t in seconds:
            t.release()
        same(in_flight__z=0, queue_length__z=0, in_flight__solo=0, up__x=0)
        # a queued request whose client leaves gives its place up
        held = [await w.on(1) for w in worlds]
        leaving = [asyncio.create_task(w.on(1)) for w in worlds]
        await queued(1, 1)
        same(in_flight__y=1, queue_length__y=1)
        for task in leaving:
            task.cancel()
        await asyncio.gather(*leaving, return_exceptions=True)
        same(in_flight__y=1, queue_length__y=0)
        for t in held:
            t.release()
        # an active health check takes y out
        for w in worlds:
            w.gw.replicas[1].healthy = False
            w.gw.gauges(w.gw.replicas[1])  # (as ReplicaSet.check does on a change)
        same(up__y=0, in_flight__y=0)
        # x's ejection runs out (0.2 s): up again at the next scrape, without a request
        for _ in range(100):
            await asyncio.sleep(0.02)
            if local.gw.replicas[0].up() and reference.gw.replicas[0].up():
                break
        same(up__x=1, up__y=0)
        for w in worlds:
            await w.close()

    asyncio.run(scenario())
    assert moments == 12


def test_replica_sets_sharing_labels_add_up() -> None:
    """Two replica sets whose labels are the same (upstream names beyond the label cap all become `other`): a scrape
    shows the sum of their in-flight requests, and a replica up while either is."""
    m = Metrics(CONFIGURED)
    one, two = _Gateway(m), _Gateway(m)

    async def scenario() -> None:
        tickets = [await one.on(0), await two.on(0)]
        two.gw.failed(two.gw.replicas[1], "unreachable")  # y ejected in `two` only
        lab = {"upstream": "gw"}
        assert value(m, "dialect_proxy_replica_in_flight", replica="x", **lab) == 2
        assert value(m, "dialect_proxy_replica_up", replica="y", **lab) == 1
        one.gw.failed(one.gw.replicas[1], "unreachable")
        assert value(m, "dialect_proxy_replica_up", replica="y", **lab) == 0
        for t in tickets:
            t.release()
        assert value(m, "dialect_proxy_replica_in_flight", replica="x", **lab) == 0
        await one.close()
        await two.close()

    asyncio.run(scenario())


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6), max_size=20),
       st.floats(allow_nan=False), st.booleans())
@settings(max_examples=300, deadline=None)
def test_the_compiled_builds_bucket_index_is_bisect_left(bounds: list[float], amount: float, exact: bool) -> None:
    """proxy/metrics/local.py `bucket_index` (the compiled build's, NATIVE_LOOPS) finds the bucket
    bisect_left finds, for an amount between, on or beyond the bounds (a histogram's end in +Inf)."""
    from bisect import bisect_left

    from proxy.metrics.local import bucket_index

    ordered = sorted(set(bounds)) + [float("inf")]
    if exact and bounds:
        amount = bounds[0]  # on a bound: the bucket whose bound it is (le is inclusive)
    assert bucket_index(ordered, amount) == bisect_left(ordered, amount)
