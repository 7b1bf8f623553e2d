"""Graceful shutdown of the real CLI process: SIGTERM mid-stream, with one process and with `--workers 2` (the
master passes the signal to each worker, which drains as a single process does)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import orjson
import pytest

from tests.conftest import answers, free_port, wait_for


def start_cli(mock_url: str, grace: float, workers: int = 1) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIALECT_PROXY_")}
    # Several workers need a shared state store (a memory one is refused at start-up); these chat streams never
    # touch it, so a Redis URL that nothing serves is enough.
    store = ["--state-store", f"redis://127.0.0.1:{free_port()}/0"] if workers > 1 else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--port", str(port), "--upstream-url", mock_url,
         "--upstream-dialect", "openai", "--shutdown-grace", str(grace), "--log-level", "warning",
         "--workers", str(workers), *store],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    if not wait_for(answers(url + "/healthz"), timeout=15):
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise RuntimeError(err.decode())
    return proc, url


def stream_events(url: str, content: str, on_first: object) -> list[str]:
    events = []
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=30, json={
            "model": "m", "stream": True, "messages": [{"role": "user", "content": content}]}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: "):])
                if len(events) == 1:
                    on_first()  # type: ignore[operator]
    return events


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_mid_stream_lets_the_stream_finish(start_mock, workers):
    mock = start_mock("openai")
    proc, url = start_cli(mock.url, 10.0, workers)
    try:
        events = stream_events(url, "[mock:chunks=30][mock:delay_ms=40]", lambda: proc.send_signal(signal.SIGTERM))
        assert events[-1] == "[DONE]"
        chunks = [orjson.loads(e) for e in events[:-1]]
        assert sum(1 for c in chunks if c["choices"][0]["delta"].get("content")) == 30
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        # uvicorn re-raises the captured SIGTERM after a clean shutdown: exit by that signal is the normal end.
        assert proc.wait(timeout=15) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_grace_over_ends_stream_with_error_event(start_mock, workers):
    mock = start_mock("openai")
    proc, url = start_cli(mock.url, 0.5, workers)
    t0 = time.monotonic()
    try:
        events = stream_events(url, "[mock:chunks=400][mock:delay_ms=25]", lambda: proc.send_signal(signal.SIGTERM))
        assert events[-1] != "[DONE]"
        last = orjson.loads(events[-1])
        assert last["error"]["code"] == "shutting_down"
        assert time.monotonic() - t0 < 8  # 400 x 25 ms would take 10 s: it was cut at the grace period
        _, err = proc.communicate(timeout=15)
        assert proc.returncode in (0, -signal.SIGTERM)
        assert "Traceback" not in err.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
