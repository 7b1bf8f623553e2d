"""`serve --workers 2`: two uvicorn worker processes, and one /metrics scrape shows the requests of both (the other
worker's as of its last flush to the shared files: at most proxy/metrics/files.py FLUSH_INTERVAL ago); with the
shared Redis state store every `previous_response_id` follow-up finds its response, whichever worker stored it."""

from __future__ import annotations

import os
import time

import httpx
import openai

from proxy.metrics.files import FLUSH_INTERVAL
from tests.conftest import serve_process


def _answered(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("dialect_proxy_requests_total{") and 'status="2xx"' in line)


def test_two_workers_serve_and_one_scrape_counts_all_requests(start_mock, tmp_path, redis_url):
    mock = start_mock("openai")
    args = ["--workers", "2", "--upstream-url", mock.url, "--upstream-dialect", "openai", "--log-level", "warning",
            "--state-store", redis_url]
    with serve_process(args, {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics")}) as url:
        n = 40
        for i in range(n):  # a new connection each time, so both workers get some
            r = httpx.post(url + "/v1/chat/completions", timeout=30, headers={"connection": "close"},
                           json={"model": "m", "messages": [{"role": "user", "content": f"hi {i}"}]})
            assert r.status_code == 200
        deadline = time.monotonic() + 3 * FLUSH_INTERVAL + 5  # bounded: the other worker flushes once a second
        total = _answered(url)
        while total < n and time.monotonic() < deadline:
            time.sleep(0.1)
            total = _answered(url)
        assert total == n
        text = httpx.get(url + "/metrics", timeout=10).text
        assert "_created" not in text and "dialect_proxy_key_" not in text  # multiprocess mode as one process
        pids = {name.split("_")[-1] for name in os.listdir(tmp_path / "metrics") if name.endswith(".db")}
        assert len(pids) >= 2  # both workers recorded


def test_two_workers_continue_every_conversation(start_mock, tmp_path, redis_url):
    """The issue's case: 10 follow-ups, each on a new connection (so on either worker), none refused."""
    mock = start_mock("openai")
    args = ["--workers", "2", "--upstream-url", mock.url, "--upstream-dialect", "openai", "--log-level", "warning",
            "--state-store", redis_url]
    with serve_process(args, {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics")}) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                               http_client=httpx.Client(headers={"connection": "close"}, timeout=30))
        for i in range(10):
            first = client.responses.create(model="m", input=f"hello {i}")
            follow = client.responses.create(model="m", input="and then?", previous_response_id=first.id)
            assert follow.status == "completed" and follow.output_text
        client.close()
