"""MindIE as an Inference Gateway pool member (docs/inference-gateway.md): the sidecar's Model Server Protocol gauges,
read the way an Endpoint Picker reads them. The mock MindIE (with its metrics port) and the sidecar run for real on
loopback; every /metrics is parsed with prometheus_client's parser."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from proxy.mock.mindie import KV_CACHE_PER_REQUEST, METRICS_REFRESH
from proxy.mock.server import create_app as create_mock_app
from proxy.settings import ConfigError, build_settings
from tests.conftest import Proxy, ServerThread, answers, free_port, serve_process, wait_for

WAITING, RUNNING, KV = "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"
MODEL = "mindie-mock"  # the mock's model name: its metrics' model_name label
SLOW = "[mock:chunks=30,delay_ms=100]"  # a stream of about three seconds


# One client for every scrape: a client made per request costs more than the scrape (its TLS context, at least).
SCRAPER = httpx.Client(timeout=5)


@pytest.fixture(scope="module", autouse=True)
def _close_scraper() -> Iterator[None]:
    yield
    SCRAPER.close()


def samples(url: str) -> dict[str, tuple[dict[str, str], float]]:
    """Every sample of a /metrics page by name (its labels, its value), read with prometheus_client's parser."""
    text = SCRAPER.get(url).text
    return {s.name: (s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples}


def failures(url: str) -> dict[str, float]:
    """dialect_proxy_engine_metrics_failures_total by reason."""
    text = SCRAPER.get(url + "/metrics").text
    return {s.labels["reason"]: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "dialect_proxy_engine_metrics_failures_total"}


@dataclass
class Pod:
    """A MindIE pod: the mock engine (its own process, serving its metrics port too), the sidecar in pool-member mode
    in front of it (`dialect-proxy serve`, a process). The test process only sends requests and reads /metrics: the
    timings it measures are not those of servers sharing its interpreter."""

    engine: subprocess.Popen[bytes]
    engine_url: str
    engine_metrics: str  # the engine's metrics port's /metrics
    sidecar: str

    def gauges(self) -> dict[str, float]:
        found = samples(self.sidecar + "/metrics")
        return {name: found[name][1] for name in (WAITING, RUNNING, KV) if name in found}

    def engine_says(self) -> dict[str, float]:
        return {name: value for name, (_, value) in samples(self.engine_metrics).items()}

    def in_flight(self) -> int:
        count: int = httpx.get(self.engine_url + "/_mock/stats", timeout=5).json()["in_flight"]
        return count

    def stop_engine(self) -> None:
        if self.engine.poll() is None:
            self.engine.terminate()
            self.engine.wait(timeout=20)


@pytest.fixture
def start_pod(tmp_path: Path) -> Iterator[Callable[..., Pod]]:
    with contextlib.ExitStack() as stack:
        def start(**upstream: Any) -> Pod:
            port, metrics_port = free_port(), free_port()
            engine = subprocess.Popen([sys.executable, "-m", "proxy", "mock", "--dialect", "mindie", "--port",
                                       str(port), "--metrics-port", str(metrics_port)], stdout=subprocess.DEVNULL)
            pod = Pod(engine, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics", "")
            stack.callback(pod.stop_engine)
            assert wait_for(answers(pod.engine_metrics), timeout=30) and wait_for(answers(pod.engine_url + "/health"))
            config = tmp_path / f"pod-{port}.yaml"
            config.write_text(yaml.safe_dump({"server": {"pool_member": True}, "upstreams": [
                {"name": "mindie", "dialect": "mindie", "url": pod.engine_url, "metrics_url": pod.engine_metrics,
                 **upstream}]}))
            pod.sidecar = stack.enter_context(serve_process(["--config", str(config)]))
            return pod

        yield start


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
    return [pool.submit(http.post, pod.sidecar + "/v1/chat/completions", json=body) for _ in range(count)]


def until(predicate: Callable[[], bool], timeout: float) -> float:
    """Seconds until `predicate` held (polled every 5 ms); fails after `timeout`."""
    started = time.monotonic()
    assert wait_for(predicate, timeout=timeout, interval=0.005)
    return time.monotonic() - started


class RawRequest:
    """A chat request on a connection opened beforehand: `send` puts its bytes on the wire at once (no client, thread
    or connection set-up in the time measured), `status` reads the answer to its end (`Connection: close`)."""

    def __init__(self, base_url: str, text: str) -> None:
        host, port = base_url.removeprefix("http://").split(":")
        body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}], "stream": True})
        self.request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
        self.sock = socket.create_connection((host, int(port)), timeout=30)

    def send(self) -> None:
        self.sock.sendall(self.request)

    def status(self) -> int:
        answer = b""
        with self.sock:
            for _ in range(10_000):  # bounded: the stream is about 30 chunks
                data = self.sock.recv(65536)
                if not data:
                    break
                answer += data
        return int(answer.split(b" ", 2)[1])


def test_a_burst_shows_in_the_gauges_at_once(start_pod: Callable[..., Pod]) -> None:
    running, queued = 3, 2
    pod = start_pod(max_in_flight=running, queue_size=queued + 1)
    assert wait_for(lambda: pod.gauges().get(RUNNING) == 0, timeout=5)  # the engine's metrics are read
    held = [RawRequest(pod.sidecar, SLOW) for _ in range(running)]
    waiting = [RawRequest(pod.sidecar, "hi") for _ in range(queued)]
    for request in held:
        request.send()
    assert until(lambda: pod.gauges().get(RUNNING) == running, 1.0) < 0.1
    assert pod.in_flight() == running  # the engine has them
    for request in waiting:
        request.send()
    assert until(lambda: pod.gauges().get(WAITING) == queued, 1.0) < 0.1
    assert pod.gauges()[RUNNING] == running
    # A refresh of the engine's own figures later (it holds the requests: they run) nothing is counted twice.
    time.sleep(METRICS_REFRESH + 0.3)
    assert pod.engine_says()["num_requests_running"] == running
    assert pod.gauges()[WAITING] == queued and pod.gauges()[RUNNING] == running
    assert [request.status() for request in held + waiting] == [200] * (running + queued)
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
    labels = samples(pod.sidecar + "/metrics")[KV][0]
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
    pod.stop_engine()  # its metrics port goes with it
    # the last reading stands for STALE_AFTER seconds (proxy/metrics/model_server.py), then the gauges are left out
    assert wait_for(lambda: not pod.gauges(), timeout=5)
    found = samples(pod.sidecar + "/metrics")
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
    pods = {"a-busy": busy.sidecar, "b-idle": idle.sidecar}
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
    r = httpx.get(pod.sidecar + "/readyz", timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["checks"]["mindie"]["path"] == "/v2/health/ready"
    pod.stop_engine()
    time.sleep(5.2)  # READY_CACHE (proxy/gateway/health.py)
    r = httpx.get(pod.sidecar + "/readyz", timeout=10)
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

