"""A real Prometheus server scrapes the real proxy while the openai SDK drives traffic through it (loopback only)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "deploy"))
from deploy_helpers import prom_query, prometheus_server  # noqa: E402

query = prom_query


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
    mock = start_mock("mindie", full_text=True)
    proxy = start_proxy(mock=mock, full_text=True, models=["DeepSeek-R1"])
    with prometheus_server(tmp_path, proxy.url.removeprefix("http://")) as (base, _, _):
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
