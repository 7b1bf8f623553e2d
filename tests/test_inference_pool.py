"""MindIE as an Inference Gateway pool member (docs/inference-gateway.md): the sidecar's Model Server Protocol gauges,
read the way an Endpoint Picker reads them. The mock MindIE (with its metrics port) and the sidecar run for real on
loopback; every /metrics is parsed with prometheus_client's parser."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.mock.mindie import KV_CACHE_PER_REQUEST, METRICS_REFRESH
from proxy.mock.server import create_app as create_mock_app
from proxy.mock.server import create_metrics_app
from proxy.settings import ConfigError, build_settings
from tests.conftest import Proxy, ServerThread, free_port, wait_for

WAITING, RUNNING, KV = "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"
MODEL = "mindie-mock"  # the mock's model name: its metrics' model_name label
SLOW = "[mock:chunks=30,delay_ms=100]"  # a stream of about three seconds


def samples(url: str) -> dict[str, tuple[dict[str, str], float]]:
    """Every sample of a /metrics page by name (its labels, its value), read with prometheus_client's parser."""
    text = httpx.get(url, timeout=5).text
    return {s.name: (s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples}


def failures(url: str) -> dict[str, float]:
    """dialect_proxy_engine_metrics_failures_total by reason."""
    text = httpx.get(url + "/metrics", timeout=5).text
    return {s.labels["reason"]: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "dialect_proxy_engine_metrics_failures_total"}


@dataclass
class Pod:
    """A MindIE pod: the mock engine, its metrics port, the sidecar in pool-member mode in front of it."""

    engine: ServerThread
    engine_metrics: ServerThread
    sidecar: Proxy

    def gauges(self) -> dict[str, float]:
        found = samples(self.sidecar.url + "/metrics")
        return {name: found[name][1] for name in (WAITING, RUNNING, KV) if name in found}

    def engine_says(self) -> dict[str, float]:
        return {name: value for name, (_, value) in samples(self.engine_metrics.url + "/metrics").items()}


@pytest.fixture
def start_pod(servers: list[ServerThread], start_proxy: Callable[..., Proxy]) -> Callable[..., Pod]:
    def start(**upstream: Any) -> Pod:
        app = create_mock_app("mindie")
        engine = ServerThread(app).start()
        servers.append(engine)
        metrics = ServerThread(create_metrics_app(app)).start()
        servers.append(metrics)
        sidecar = start_proxy([{"name": "mindie", "dialect": "mindie", "url": engine.url,
                                "metrics_url": metrics.url + "/metrics", **upstream}], server={"pool_member": True})
        return Pod(engine, metrics, sidecar)

    return start


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(16) as executor:
        yield executor


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    """One client for all requests (made once: a client of its own per request costs tens of ms to make)."""
    with httpx.Client(timeout=60, limits=httpx.Limits(max_connections=32)) as client:
        yield client


def send(pool: ThreadPoolExecutor, http: httpx.Client, pod: Pod, text: str,
         count: int) -> list[Future[httpx.Response]]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "stream": True}
    return [pool.submit(http.post, pod.sidecar.base_url + "/chat/completions", json=body) for _ in range(count)]


def until(predicate: Callable[[], bool], timeout: float) -> float:
    """Seconds until `predicate` held (polled every 5 ms); fails after `timeout`."""
    started = time.monotonic()
    assert wait_for(predicate, timeout=timeout, interval=0.005)
    return time.monotonic() - started


def test_a_burst_shows_in_the_gauges_at_once(start_pod: Callable[..., Pod], pool: ThreadPoolExecutor,
        http: httpx.Client) -> None:
    running, queued = 3, 2
    pod = start_pod(max_in_flight=running, queue_size=queued + 1)
    assert wait_for(lambda: pod.gauges().get(RUNNING) == 0, timeout=5)  # the engine's metrics are read
    held = send(pool, http, pod, SLOW, running)
    assert wait_for(lambda: httpx.get(pod.engine.url + "/_mock/stats", timeout=5).json()["in_flight"] == running)
    assert until(lambda: pod.gauges().get(RUNNING) == running, 1.0) < 0.1
    waiting = send(pool, http, pod, "hi", queued)
    assert until(lambda: pod.gauges().get(WAITING) == queued, 1.0) < 0.1
    assert pod.gauges()[RUNNING] == running
    # A refresh of the engine's own figures later (it holds the requests: they run) nothing is counted twice.
    time.sleep(METRICS_REFRESH + 0.3)
    assert pod.engine_says()["num_requests_running"] == running
    assert pod.gauges()[WAITING] == queued and pod.gauges()[RUNNING] == running
    for future in held + waiting:
        assert future.result(timeout=30).status_code == 200
    # and the drain shows before the engine's next refresh could tell it
    assert until(lambda: pod.gauges().get(RUNNING) == 0 and pod.gauges().get(WAITING) == 0, 1.0) < METRICS_REFRESH


def test_the_kv_cache_gauge_follows_the_engine(start_pod: Callable[..., Pod], pool: ThreadPoolExecutor,
        http: httpx.Client) -> None:
    pod = start_pod()
    assert wait_for(lambda: pod.gauges().get(KV) == 0.0, timeout=5)
    held = send(pool, http, pod, SLOW, 4)
    # The engine's figure rises at its next refresh; the sidecar's follows it within its reading interval.
    assert wait_for(lambda: pod.engine_says()["npu_cache_usage_perc"] > 0, timeout=3)
    engine = pod.engine_says()["npu_cache_usage_perc"]
    assert engine == pytest.approx(4 * KV_CACHE_PER_REQUEST)
    assert wait_for(lambda: pod.gauges().get(KV) == engine, timeout=1)
    labels = samples(pod.sidecar.url + "/metrics")[KV][0]
    assert labels == {"model_name": MODEL}  # the engine's model_name label, kept
    for future in held:
        assert future.result(timeout=30).status_code == 200
    assert wait_for(lambda: pod.gauges().get(KV) == 0.0, timeout=3)


def test_a_metrics_port_that_is_down_is_missing_data_not_zeros(start_proxy: Callable[..., Proxy],
                                                               servers: list[ServerThread]) -> None:
    engine = ServerThread(create_mock_app("mindie")).start()
    servers.append(engine)
    closed = free_port()  # nothing listens there
    sidecar = start_proxy([{"name": "mindie", "dialect": "mindie", "url": engine.url,
                            "metrics_url": f"http://127.0.0.1:{closed}/metrics"}], server={"pool_member": True})
    assert wait_for(lambda: failures(sidecar.url).get("unreachable", 0) >= 1, timeout=5)
    found = samples(sidecar.url + "/metrics")
    assert not {WAITING, RUNNING, KV} & set(found)
    assert found["dialect_proxy_engine_metrics_up"] == ({"upstream": "mindie"}, 0.0)
    assert failures(sidecar.url)["missing"] == 0
    own = {n for n in found if n.startswith("dialect_proxy_") and "engine_metrics" not in n}
    assert own  # the proxy's own metrics are served as ever


def test_gauges_go_when_the_engine_metrics_stop(start_pod: Callable[..., Pod]) -> None:
    pod = start_pod()
    assert wait_for(lambda: KV in pod.gauges(), timeout=5)
    pod.engine_metrics.stop()
    # the last reading stands for STALE_AFTER seconds (proxy/metrics/model_server.py), then the gauges are left out
    assert wait_for(lambda: not pod.gauges(), timeout=5)
    found = samples(pod.sidecar.url + "/metrics")
    assert found["dialect_proxy_engine_metrics_up"][1] == 0.0
    assert found["dialect_proxy_engine_metrics_age_seconds"][1] > 2.0


# -- the Endpoint Picker's choice, read from /metrics alone -------------------------------------------------------

def epp_pick(pods: dict[str, str]) -> str:
    """The EPP's default scheduling profile (llm-d-router's default plugins: queue-scorer and
    kv-cache-utilization-scorer, weight 2 each, and a max-score picker; the prefix scorer adds nothing for requests
    with no shared prefix), reading each pod's /metrics as its `vllm` engine configuration does. queue-scorer:
    (max − queue) / (max − min), 1 for all when equal; kv-cache-utilization-scorer: 1 − usage. So: least queue first,
    then least KV cache. A pod whose gauges are missing is not scored (the EPP keeps no invented values)."""
    read: dict[str, tuple[float, float]] = {}
    for name, url in pods.items():
        found = samples(url + "/metrics")
        if WAITING in found and KV in found:
            read[name] = (found[WAITING][1], found[KV][1])
    assert read, "no pod's metrics were readable"
    low, high = min(q for q, _ in read.values()), max(q for q, _ in read.values())

    def score(queue: float, kv: float) -> float:
        queue_score = 1.0 if high == low else (high - queue) / (high - low)
        return 2 * queue_score + 2 * (1 - kv)

    return max(sorted(read), key=lambda name: score(*read[name]))


def test_the_endpoint_pickers_rule_picks_the_idle_pod(start_pod: Callable[..., Pod],
                                                      pool: ThreadPoolExecutor,
        http: httpx.Client) -> None:
    busy, idle = start_pod(max_in_flight=2, queue_size=4), start_pod(max_in_flight=2, queue_size=4)
    pods = {"a-busy": busy.sidecar.url, "b-idle": idle.sidecar.url}
    assert wait_for(lambda: KV in busy.gauges() and KV in idle.gauges(), timeout=5)
    # Queues equal (none), KV caches equal: the tie goes to the first by name, the busy pod.
    assert epp_pick(pods) == "a-busy"
    held = send(pool, http, busy, SLOW, 3)  # two run, one waits in the busy pod's sidecar
    assert wait_for(lambda: busy.gauges().get(WAITING) == 1, timeout=2)
    assert epp_pick(pods) == "b-idle"  # least queue
    # Once its queue is served, the busy pod still holds KV cache: the KV-cache scorer decides.
    assert wait_for(lambda: busy.gauges().get(WAITING) == 0 and busy.gauges().get(KV, 0) > 0, timeout=10)
    assert epp_pick(pods) == "b-idle"
    for future in held:
        assert future.result(timeout=30).status_code == 200


# -- pool-member mode --------------------------------------------------------------------------------------------

def test_pool_member_readiness_follows_the_engines_ready_path(start_pod: Callable[..., Pod]) -> None:
    pod = start_pod()
    r = httpx.get(pod.sidecar.url + "/readyz", timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["checks"]["mindie"]["path"] == "/v2/health/ready"
    pod.engine.stop()
    time.sleep(5.2)  # READY_CACHE (proxy/gateway/health.py)
    r = httpx.get(pod.sidecar.url + "/readyz", timeout=10)
    assert r.status_code == 503 and r.json()["checks"]["mindie"]["path"] == "/v2/health/ready"


@pytest.mark.parametrize(("upstreams", "server", "says"), [
    ([{"dialect": "mindie", "url": ["http://127.0.0.1:1", "http://127.0.0.1:2"],
       "metrics_url": "http://127.0.0.1:3/metrics"}], {"pool_member": True}, "one url"),
    ([{"dialect": "mindie", "url": "http://127.0.0.1:1"}], {"pool_member": True}, "metrics_url"),
    ([{"dialect": "openai", "url": "http://127.0.0.1:1", "metrics_url": "http://127.0.0.1:3/metrics"}],
     {"model_server_metrics": True}, "engine metrics are not known"),
    ([{"dialect": "mindie", "url": "http://127.0.0.1:1", "metrics_url": "http://127.0.0.1:3/metrics"},
      {"name": "b", "dialect": "mindie", "url": "http://127.0.0.1:2", "models": ["b"]}],
     {"model_server_metrics": True}, "exactly one upstream"),
    ([{"dialect": "mindie", "url": "http://127.0.0.1:1", "metrics_url": "http://127.0.0.1:3/metrics"}],
     {"pool_member": True, "workers": 2, "state_store": "redis://127.0.0.1:6379/0"}, "one worker"),
])
def test_pool_member_settings_are_checked(upstreams: list[dict[str, Any]], server: dict[str, Any],
                                          says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        build_settings(config={"upstreams": upstreams, "server": server}, environ={})


def test_off_by_default_the_metrics_are_unchanged(start_proxy: Callable[..., Proxy],
                                                  servers: list[ServerThread]) -> None:
    engine = ServerThread(create_mock_app("mindie")).start()
    servers.append(engine)
    sidecar = start_proxy([{"name": "mindie", "dialect": "mindie", "url": engine.url,
                            "metrics_url": "http://127.0.0.1:1/metrics"}])
    text = httpx.get(sidecar.url + "/metrics", timeout=5).text
    assert "vllm:" not in text and "dialect_proxy_engine_metrics" not in text


def test_the_command_line_runs_a_pool_member(tmp_path: Any) -> None:
    """`dialect-proxy mock --metrics-port` and `dialect-proxy serve` in pool-member mode, as processes."""
    import subprocess
    import sys

    import yaml

    from tests.conftest import answers, serve_process

    port, metrics_port = free_port(), free_port()
    mock = subprocess.Popen([sys.executable, "-m", "proxy", "mock", "--dialect", "mindie", "--port", str(port),
                             "--metrics-port", str(metrics_port)], stdout=subprocess.DEVNULL)
    try:
        assert wait_for(answers(f"http://127.0.0.1:{metrics_port}/metrics"), timeout=30)
        engine = {name: value for name, (labels, value) in samples(f"http://127.0.0.1:{metrics_port}/metrics").items()
                  if labels == {"model_name": MODEL}}
        assert engine == {"num_requests_waiting": 0, "num_requests_running": 0, "npu_cache_usage_perc": 0}
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump({"server": {"pool_member": True}, "upstreams": [
            {"name": "mindie", "dialect": "mindie", "url": f"http://127.0.0.1:{port}",
             "metrics_url": f"http://127.0.0.1:{metrics_port}/metrics"}]}))
        with serve_process(["--config", str(config)]) as url:
            assert wait_for(lambda: KV in samples(url + "/metrics"), timeout=10)
            assert samples(url + "/metrics")[RUNNING] == ({"model_name": MODEL}, 0.0)
            assert httpx.get(url + "/readyz", timeout=10).status_code == 200
    finally:
        mock.terminate()
        mock.wait(timeout=20)
