"""A real Prometheus server scrapes the real proxy while the openai SDK drives traffic through it (loopback only)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent / "deploy"))
from deploy_helpers import tool  # noqa: E402

from tests.conftest import free_port  # noqa: E402


def query(base: str, expr: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        data = json.load(r)
    assert data["status"] == "success", data
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


def wait_value(base: str, expr: str, want: float, deadline: float) -> float:
    last: float | None = None
    while time.monotonic() < deadline:
        try:
            result = query(base, expr)
            if result:
                last = float(result[0]["value"][1])
                if last == want:
                    return last
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{expr} = {last}, want {want}")


def test_prometheus_scrapes_request_counter_and_ttft_quantile(start_mock, start_proxy, tmp_path):
    binary = tool("prometheus", "apt-get install -y prometheus")
    mock = start_mock("mindie", full_text=True)
    proxy = start_proxy(mock=mock, full_text=True, models=["DeepSeek-R1"])
    host_port = proxy.url.removeprefix("http://")
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "dialect-proxy", "static_configs": [{"targets": [host_port]}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        client = proxy.client()
        streams = 12
        for i in range(streams):
            chunks = list(client.chat.completions.create(
                model="DeepSeek-R1", stream=True,
                messages=[{"role": "user", "content": f"question {i} [mock:chunks=8][mock:delay_ms=10]"}]))
            assert chunks[-1].choices[0].finish_reason is not None
        client.chat.completions.create(model="DeepSeek-R1", messages=[{"role": "user", "content": "once more"}])
        deadline = time.monotonic() + 60
        total = ('sum(dialect_proxy_requests_total{route="/v1/chat/completions",model="DeepSeek-R1",'
                 'status="2xx",outcome="ok"})')
        assert wait_value(base, total, streams + 1, deadline) == streams + 1
        assert wait_value(base, 'sum(dialect_proxy_time_to_first_token_seconds_count{model="DeepSeek-R1"})',
                          streams, deadline) == streams
        p95 = query(base, "histogram_quantile(0.95, sum by (le) "
                          "(dialect_proxy_time_to_first_token_seconds_bucket{model=\"DeepSeek-R1\"}))")
        value = float(p95[0]["value"][1])
        assert 0 < value < 5, value  # a real quantile (not NaN): the mock answers in milliseconds
        tokens = query(base, 'sum by (kind) (dialect_proxy_tokens_total{model="DeepSeek-R1"})')
        by_kind = {r["metric"]["kind"]: float(r["value"][1]) for r in tokens}
        assert by_kind["completion"] >= streams * 8
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
