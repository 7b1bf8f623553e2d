"""proxy/local_metrics.py: the lock-free families render what prometheus_client's classes render, and a scrape shows
live values (in-flight requests, token latencies mid-stream, replica admission gauges)."""

from __future__ import annotations

import asyncio
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.dialects import get_dialect
from proxy.local_metrics import LocalCounter, LocalGauge, LocalHistogram
from proxy.metrics import Metrics
from proxy.redact import Redactor
from proxy.replicas import ReplicaSet
from proxy.settings import ReplicaSettings, ServerSettings, UpstreamSettings
from tests.test_metrics import CONFIGURED, ROUTE, FakeClock, clock, promtool_check_metrics, run_script, value

__all__ = ["clock"]  # the fixture, imported for the tests below

CREATED = re.compile(r"^(\S+_created(?:\{.*\})?) \S+$", re.MULTILINE)


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
    assert "dialect_proxy_requests_created{" in text  # the _created series are there, as prometheus_client's
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
        first = await rset.attempts({}, {}).next()
        assert gauges() == (1, 0, 1)
        waiting = asyncio.create_task(rset.attempts({}, {}).next())
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
