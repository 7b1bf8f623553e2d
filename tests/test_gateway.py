"""Gateway mode (docs/gateway.md): replicas of one upstream, failover before the first byte, outlier ejection, active
health, admission control with 429 + Retry-After, prefix affinity, named inbound keys. Real mock replicas and the
real proxy on loopback, driven by the openai SDK; broken replicas are made with server-wide mock directives
(proxy/mock/README.md) or by stopping a mock's server."""

from __future__ import annotations

import json
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import free_port, serve_process, wait_for


def metric(proxy: Any, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    text = httpx.get(proxy.url + "/metrics", timeout=5).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def set_directives(mock: Any, text: str) -> None:
    httpx.post(mock.url + "/_mock/directives", json={"directives": text}, timeout=5).raise_for_status()


def chat(client: openai.OpenAI, text: str = "hello", stream: bool = False, **kw: Any) -> str:
    messages = [{"role": "user", "content": text}]
    if stream:
        parts = []
        for chunk in client.chat.completions.create(model="m", messages=messages, stream=True, **kw):
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
        return "".join(parts)
    return client.chat.completions.create(model="m", messages=messages, **kw).choices[0].message.content or ""


def test_every_request_succeeds_while_a_healthy_replica_exists(start_mock, start_proxy) -> None:
    healthy = start_mock("mindie")
    busy = start_mock("mindie", directives="error=503")  # MindIE's answer when saturated: 503, empty body
    hanging = start_mock("mindie", directives="hang=20")  # never sends headers
    doomed = start_mock("mindie")  # stopped mid-run
    refused = f"http://127.0.0.1:{free_port()}"  # nothing listens
    proxy = start_proxy([{"name": "npu", "dialect": "mindie", "retries": 4, "outlier_failures": 2,
                          "outlier_backoff": 60, "health_interval": 0,
                          "url": [healthy.url, busy.url, hanging.url, doomed.url, refused]}],
                        server={"first_byte_timeout": 1.0})
    client = proxy.client(timeout=30)
    total = 48
    done = threading.Event()
    answers: list[str] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        text = chat(client, f"question {i}", stream=i % 2 == 0)
        with lock:
            answers.append(text)
            if len(answers) == total // 3:
                done.set()

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(one, i) for i in range(total)]
        assert done.wait(60)
        doomed_done = doomed.stats()["completed"]
        doomed.srv.stop()  # killed mid-run: its pooled connections break, then it refuses
        for f in futures:
            f.result(timeout=120)  # every request succeeded (an exception would surface here)

    assert len(answers) == total and all(a.startswith("Hello from the mock") for a in answers)
    assert total - doomed_done >= healthy.stats()["completed"] >= total // 3 - doomed_done
    # Counts add up: every client request was answered once, by one replica ...
    assert metric(proxy, "dialect_proxy_requests_total", status="2xx", outcome="ok") == total
    assert metric(proxy, "dialect_proxy_upstream_attempts_total", result="ok") == total
    # ... every failed attempt was followed by a retry (there was always a replica left to try) ...
    failed = sum(metric(proxy, "dialect_proxy_upstream_attempts_total", result=r)
                 for r in ("unreachable", "timeout", "bad_gateway", "unavailable"))
    assert failed >= 3 and metric(proxy, "dialect_proxy_retries_total") == failed
    # ... and the sick replicas were ejected (passive health), so they saw few of the requests.
    assert metric(proxy, "dialect_proxy_replica_ejections_total", replica="1") >= 1  # busy
    assert metric(proxy, "dialect_proxy_replica_ejections_total", replica="2") >= 1  # hanging
    assert metric(proxy, "dialect_proxy_replica_ejections_total", replica="4") >= 1  # refused
    assert busy.stats()["requests"] <= 4 and hanging.stats()["requests"] <= 4


def test_no_retry_once_a_byte_reached_the_client(start_mock, start_proxy) -> None:
    # Both replicas cut the stream after 3 tokens: the client sees the cut (an error event, no [DONE]), and no
    # second replica is asked, although retries are allowed.
    a = start_mock("openai", directives="drop=3")
    b = start_mock("openai", directives="drop=3")
    proxy = start_proxy([{"name": "up", "dialect": "openai", "url": f"{a.url},{b.url}", "retries": 2}])
    with pytest.raises(openai.APIError):
        chat(proxy.client(), "[mock:chunks=10]", stream=True)
    assert a.stats()["requests"] + b.stats()["requests"] == 1
    assert metric(proxy, "dialect_proxy_retries_total") == 0
    assert metric(proxy, "dialect_proxy_requests_total", outcome="truncated") == 1


def test_retry_is_in_the_access_log(start_mock, start_proxy, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dialect_proxy.access")
    good = start_mock("openai")
    refused = f"http://127.0.0.1:{free_port()}"
    proxy = start_proxy([{"name": "up", "dialect": "openai", "url": [refused, good.url], "balance":
                          "least_outstanding", "outlier_failures": 0, "health_interval": 0}])
    client = proxy.client()
    for i in range(12):  # least_outstanding breaks ties at random: the refusing replica is picked some times
        assert chat(client, f"q{i}")
    def access() -> list[dict[str, Any]]:
        return [json.loads(r.getMessage()) for r in caplog.records if r.name == "dialect_proxy.access"]

    assert wait_for(lambda: len(access()) == 12)  # (each line is written just after its answer was sent)
    lines = access()
    assert all(line["replica"] == "1" for line in lines)
    retried = [line for line in lines if line.get("retries")]
    assert retried  # (all 12 picking the good replica first: 1 in 4096)
    assert all(line["retries"] == [{"replica": "0", "error": "unreachable"}] for line in retried)
    assert metric(proxy, "dialect_proxy_retries_total", reason="unreachable") == len(retried)


def test_last_failure_is_the_answer_when_no_replica_is_left(start_mock, start_proxy) -> None:
    a = start_mock("mindie", directives="error=503")
    b = start_mock("mindie", directives="error=503")
    proxy = start_proxy([{"name": "npu", "dialect": "mindie", "url": [a.url, b.url], "retries": 5}])
    with pytest.raises(openai.APIStatusError) as e:
        chat(proxy.client())
    assert e.value.status_code == 503
    assert a.stats()["requests"] == 1 and b.stats()["requests"] == 1  # each replica tried once
    assert metric(proxy, "dialect_proxy_retries_total", reason="unavailable") == 1


def test_active_health_and_readyz_per_replica(start_mock, start_proxy) -> None:
    up = start_mock("openai")
    sick = start_mock("openai", directives="unhealthy")
    proxy = start_proxy([{"name": "up", "dialect": "openai", "health_interval": 0.2,
                          "url": [{"url": up.url, "name": "a", "health_url": up.url + "/health"},
                                  {"url": sick.url, "name": "b", "health_url": sick.url + "/health"}]}])
    r = httpx.get(proxy.url + "/readyz", timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["upstreams"]["up"] == "up (1 of 2 replicas)"
    assert body["checks"]["up"]["replicas"]["b"]["status"] == 503 and body["checks"]["up"]["replicas"]["a"]["ready"]
    assert wait_for(lambda: metric(proxy, "dialect_proxy_replica_up", replica="b") == 0)
    client = proxy.client()
    for i in range(6):
        assert chat(client, f"q{i}")
    assert sick.stats()["requests"] == 0 and up.stats()["requests"] == 6
    set_directives(sick, "")  # it recovers: the next check takes it back
    assert wait_for(lambda: metric(proxy, "dialect_proxy_replica_up", replica="b") == 1)
    set_directives(up, "unhealthy")
    set_directives(sick, "unhealthy")
    # /readyz answers from checks up to READY_CACHE seconds old (proxy/gateway/health.py): it turns within that
    assert wait_for(lambda: httpx.get(proxy.url + "/readyz", timeout=10).status_code == 503, timeout=15)
    r = httpx.get(proxy.url + "/readyz", timeout=10)
    assert r.status_code == 503 and r.json()["upstreams"]["up"].startswith("down: ")


def test_admission_queue_and_429_with_retry_after(start_mock, start_proxy) -> None:
    mock = start_mock("openai")
    proxy = start_proxy([{"name": "up", "dialect": "openai", "url": mock.url, "max_in_flight": 1, "queue_size": 1,
                          "queue_timeout": 1.5}])
    slow = {"model": "m", "messages": [{"role": "user", "content": "[mock:stall=2]"}], "stream": True}
    quick = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=proxy.base_url, timeout=30) as http:
        with http.stream("POST", "/chat/completions", json=slow) as holder:
            assert holder.status_code == 200
            reader = holder.iter_bytes()  # (kept: a dropped iterator closes the response)
            next(reader)  # the one slot is taken
            with ThreadPoolExecutor(2) as pool:
                queued = pool.submit(http.post, "/chat/completions", json=quick)  # waits in the queue ...
                assert wait_for(lambda: metric(proxy, "dialect_proxy_replica_queue_length") == 1)
                full = http.post("/chat/completions", json=quick)  # ... so the queue is full
                timed_out = queued.result(timeout=10)  # ... and it gave up after queue_timeout
            for r, reason in ((full, "queue_full"), (timed_out, "queue_timeout")):
                assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited"
                assert r.headers["retry-after"].isdigit() and int(r.headers["retry-after"]) >= 1
                assert "x-should-retry" not in r.headers
                assert metric(proxy, "dialect_proxy_admission_rejections_total", reason=reason) == 1
        # the stalled stream's client leaves: its slot is freed
    assert wait_for(lambda: metric(proxy, "dialect_proxy_replica_in_flight") == 0)
    assert chat(proxy.client())
    assert metric(proxy, "dialect_proxy_replica_queue_length") == 0
    assert metric(proxy, "dialect_proxy_replica_queue_wait_seconds_count") == 1


def test_openai_sdk_retries_the_429(start_mock, start_proxy) -> None:
    mock = start_mock("openai")
    proxy = start_proxy([{"name": "up", "dialect": "openai", "url": mock.url, "max_in_flight": 1}])
    slow = {"model": "m", "messages": [{"role": "user", "content": "[mock:chunks=20,delay_ms=25]"}], "stream": True}
    with httpx.Client(base_url=proxy.base_url, timeout=30) as http:
        with http.stream("POST", "/chat/completions", json=slow) as holder:
            reader = holder.iter_bytes()
            next(reader)
            with ThreadPoolExecutor(1) as pool:
                answer = pool.submit(chat, proxy.client(max_retries=3), "hi")
                assert wait_for(lambda: metric(proxy, "dialect_proxy_admission_rejections_total") >= 1)
                assert b"[DONE]" in b"".join(reader)
                assert answer.result(timeout=30).startswith("Hello from the mock")
    assert metric(proxy, "dialect_proxy_requests_total", status="4xx") >= 1
    assert metric(proxy, "dialect_proxy_requests_total", status="2xx") == 2


def test_prefix_affinity_keeps_a_conversation_on_one_replica(start_mock, start_proxy) -> None:
    mocks = [start_mock("openai") for _ in range(3)]
    proxy = start_proxy([{"name": "up", "dialect": "openai", "balance": "prefix_affinity",
                          "url": [m.url for m in mocks]}])
    client = proxy.client()
    conversations, turns = 6, 4
    for c in range(conversations):
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
        for t in range(turns):
            messages.append({"role": "user", "content": f"conversation {c}, turn {t}"})
            reply = client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    counts = [httpx.get(m.url + "/_mock/prefix_cache").json() for m in mocks]
    assert sum(c["requests"] for c in counts) == conversations * turns
    assert all(c["requests"] % turns == 0 for c in counts)  # whole conversations per replica
    assert sum(c["requests"] > 0 for c in counts) >= 2  # and they are spread
    assert metric(proxy, "dialect_proxy_affinity_decisions_total", result="owner") == conversations * turns


def test_named_keys_in_access_log_and_metrics(start_mock, start_proxy, tmp_path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dialect_proxy.access")
    keys = tmp_path / "keys.yaml"
    keys.write_text("team-a: sk-aaa\nteam-b: sk-bbb\n")
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock, server={"api_keys_file": str(keys), "api_keys_env": "KEYS"},
                        environ={"KEYS": "sk-env"})
    for key, n in (("sk-aaa", 2), ("sk-bbb", 1), ("sk-env", 1)):
        with openai.OpenAI(base_url=proxy.base_url, api_key=key, max_retries=0) as client:
            for _ in range(n):
                assert chat(client)
    r = httpx.post(proxy.base_url + "/chat/completions", headers={"x-api-key": "sk-bbb"}, timeout=10,
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})  # Anthropic clients' header
    assert r.status_code == 200
    with openai.OpenAI(base_url=proxy.base_url, api_key="sk-wrong", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            chat(client)
    def names() -> list[str]:
        return [json.loads(r.getMessage()).get("key") for r in caplog.records if r.name == "dialect_proxy.access"]

    assert wait_for(lambda: len(names()) == 5)
    assert sorted(names()) == ["env-1", "team-a", "team-a", "team-b", "team-b"]
    assert metric(proxy, "dialect_proxy_key_requests_total", key="team-a", status="2xx") == 2
    assert metric(proxy, "dialect_proxy_key_requests_total", key="env-1") == 1
    assert metric(proxy, "dialect_proxy_key_tokens_total", key="team-b", kind="completion") == 26
    assert "sk-aaa" not in httpx.get(proxy.url + "/metrics").text


# -- the replica gauges a scrape shows, single process and multiprocess -----------------------------------------------

def _gauge_upstream(good: str, refused: str) -> dict[str, Any]:
    """Replica 0 answers, replica 1 refuses: one failure ejects it for a minute; one slot per replica, one queued."""
    return {"name": "up", "dialect": "openai", "url": [good, refused], "max_in_flight": 1, "queue_size": 1,
            "queue_timeout": 10, "outlier_failures": 1, "outlier_backoff": 60, "retries": 1, "health_interval": 0}


def _scrape_through_the_moments(proxy: Any) -> None:
    """Drives the proxy at `proxy.url` (upstream `_gauge_upstream`) with the openai SDK and raw HTTP, and checks the
    replica gauges a scrape shows: after the ejection, while a request is in flight and one is queued, after
    release."""

    def gauges(replica: str) -> tuple[float, float, float]:
        return (metric(proxy, "dialect_proxy_replica_in_flight", replica=replica),
                metric(proxy, "dialect_proxy_replica_queue_length", replica=replica),
                metric(proxy, "dialect_proxy_replica_up", replica=replica))

    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0, timeout=30)
    try:
        assert gauges("0") == (0, 0, 1) and gauges("1") == (0, 0, 1)
        for i in range(30):  # least_outstanding breaks ties at random: the refusing replica is tried soon
            assert chat(client, f"q{i}")
            if metric(proxy, "dialect_proxy_replica_ejections_total", replica="1"):
                break
        assert metric(proxy, "dialect_proxy_replica_ejections_total", replica="1") == 1
        assert gauges("1") == (0, 0, 0)  # ejected: out, nothing in flight there
        assert gauges("0") == (0, 0, 1)
        stalled = {"model": "m", "messages": [{"role": "user", "content": "[mock:stall=1]"}], "stream": True}
        with httpx.Client(base_url=proxy.url + "/v1", timeout=30) as http:
            with http.stream("POST", "/chat/completions", json=stalled) as holder:
                assert holder.status_code == 200
                reader = holder.iter_bytes()
                next(reader)  # replica 0's one slot is taken (replica 1 is out)
                assert gauges("0") == (1, 0, 1)
                with ThreadPoolExecutor(1) as pool:
                    queued = pool.submit(chat, client, "queued")
                    assert wait_for(lambda: gauges("0")[1] == 1, timeout=10)
                    assert gauges("0") == (1, 1, 1) and gauges("1") == (0, 0, 0)
                    holder.close()  # the client leaves: its slot goes to the queued request
                    assert queued.result(timeout=30)
        assert wait_for(lambda: gauges("0") == (0, 0, 1), timeout=10)
        assert gauges("1") == (0, 0, 0)
        assert metric(proxy, "dialect_proxy_replica_queue_wait_seconds_count", replica="0") == 1
    finally:
        client.close()


def test_replica_gauges_in_a_scrape(start_mock, start_proxy) -> None:
    """One process: the gauges read the replicas' state at scrape time."""
    good = start_mock("openai")
    proxy = start_proxy([_gauge_upstream(good.url, f"http://127.0.0.1:{free_port()}")])
    _scrape_through_the_moments(proxy)


def test_replica_gauges_in_a_scrape_multiprocess(start_mock, tmp_path) -> None:
    """Multiprocess mode (PROMETHEUS_MULTIPROC_DIR set, as `--workers N` does; one worker, so that the queue it
    fills is the one the scrape reads): the gauges are written to the worker's files on every change, and a scrape
    merges the files."""
    good = start_mock("openai")
    config = tmp_path / "proxy.yaml"
    config.write_text(json.dumps({"upstreams": [_gauge_upstream(good.url, f"http://127.0.0.1:{free_port()}")]}))
    (tmp_path / "metrics").mkdir()
    args = ["--config", str(config), "--log-level", "error"]
    with serve_process(args, {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics")}) as url:
        _scrape_through_the_moments(SimpleNamespace(url=url))
        assert any(name.startswith("gauge_livesum") for name in os.listdir(tmp_path / "metrics"))
