"""Mid-stream deadlines: keep-alive comments during upstream silence, then an error event at the idle timeout."""

from __future__ import annotations

import time

import httpx
import orjson


def raw_stream(url: str, content: str) -> tuple[list[str], float]:
    t0 = time.monotonic()
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=30, json={
            "model": "m", "stream": True, "messages": [{"role": "user", "content": content}]}) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    return lines, time.monotonic() - t0


def test_silence_gets_keepalive_comments_and_the_stream_still_completes(start_mock, start_proxy):
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock, server={"keepalive_interval": 0.2, "idle_timeout": 5})
    lines, _ = raw_stream(proxy.url, "[mock:chunks=3][mock:delay_ms=900]")
    assert lines[-1] == "data: [DONE]"
    assert sum(1 for line in lines if line == ": keep-alive") >= 4  # ~2 gaps of 0.9 s at 0.2 s intervals
    data = [line for line in lines if line.startswith("data: {")]
    assert sum(1 for d in data if orjson.loads(d[6:])["choices"][0]["delta"].get("content")) == 3


def test_upstream_silent_past_idle_timeout_ends_stream_with_error_event(start_mock, start_proxy):
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock, server={"keepalive_interval": 0.3, "idle_timeout": 1.0})
    lines, elapsed = raw_stream(proxy.url, "[mock:chunks=10][mock:stall=2]")
    assert lines[-1] != "data: [DONE]"
    err = orjson.loads(lines[-1][len("data: "):])["error"]
    assert err["type"] == "timeout_error" and "sent nothing for 1 s" in err["message"]
    assert ": keep-alive" in lines
    assert 0.9 < elapsed < 5
    contents = [orjson.loads(line[6:]) for line in lines if line.startswith("data: {\"id\"")]
    assert sum(1 for c in contents if c["choices"] and c["choices"][0]["delta"].get("content")) == 2


def test_total_timeout_cuts_a_long_stream(start_mock, start_proxy):
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock, server={"keepalive_interval": 5, "total_timeout": 1.0})
    lines, elapsed = raw_stream(proxy.url, "[mock:chunks=100][mock:delay_ms=50]")
    assert orjson.loads(lines[-1][len("data: "):])["error"]["code"] == "upstream_timeout"
    assert elapsed < 3
