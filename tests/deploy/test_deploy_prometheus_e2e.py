"""A real Prometheus server (loopback only) scrapes a live Metrics endpoint, evaluates deploy/prometheus/alerts.yml,
and answers every Grafana dashboard query with data: the queries work against what the proxy really exports."""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_helpers import (
    PROMETHEUS_DIR,
    all_queries,
    exercised_metrics,
    grafana_to_promql,
    prom_query,
    prometheus_server,
)

SCRAPE_INTERVAL_S = 1
STARTUP_DEADLINE_S = 60.0
RATE_WINDOW = "15s"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def metrics_endpoint() -> Iterator[str]:
    m = exercised_metrics()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body, ctype = m.render()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture
def prometheus(metrics_endpoint: str, tmp_path: Path) -> Iterator[str]:
    shutil.copy(PROMETHEUS_DIR / "alerts.yml", tmp_path / "alerts.yml")
    with prometheus_server(tmp_path, metrics_endpoint, ["alerts.yml"], SCRAPE_INTERVAL_S) as (base, proc, log):
        deadline = time.monotonic() + STARTUP_DEADLINE_S
        while True:  # until three scrapes are stored (rate() needs two samples in its window)
            assert proc.poll() is None, log.read_text()
            try:
                result = query(base, 'count_over_time(up{job="dialect-proxy"}[1m])')
                if result and float(result[0]["value"][1]) >= 3:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "Prometheus did not scrape in time:\n" + log.read_text()
            time.sleep(0.5)
        yield base


query = prom_query


def test_scrape_rules_and_dashboard_queries(prometheus: str) -> None:
    assert query(prometheus, 'up{job="dialect-proxy"}')[0]["value"][1] == "1"

    # Every alert rule evaluates without error against the real series.
    with urllib.request.urlopen(f"{prometheus}/api/v1/rules", timeout=10) as r:
        groups = json.load(r)["data"]["groups"]
    rules = [rule for g in groups for rule in g["rules"]]
    assert len(rules) == sum(len(g["rules"]) for g in yaml.safe_load(
        (PROMETHEUS_DIR / "alerts.yml").read_text())["groups"])
    deadline = time.monotonic() + 30
    while any(rule.get("lastEvaluation", "").startswith("0001") for rule in rules):
        assert time.monotonic() < deadline
        time.sleep(0.5)
        with urllib.request.urlopen(f"{prometheus}/api/v1/rules", timeout=10) as r:
            rules = [rule for g in json.load(r)["data"]["groups"] for rule in g["rules"]]
    for rule in rules:
        assert rule["health"] == "ok", rule

    # Every dashboard query returns series: it names metrics and labels that exist.
    empty = []
    for where, expr in all_queries():
        if not query(prometheus, grafana_to_promql(expr, RATE_WINDOW)):
            empty.append(f"{where}: {expr}")
    assert not empty, "queries without data:\n" + "\n".join(empty)
