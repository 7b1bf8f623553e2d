"""Graceful shutdown of the real CLI process: SIGTERM mid-stream, with one process and with `--workers 2` (the
master passes the signal to each worker, which drains as a single process does)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import httpx
import orjson
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

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


def _ws_events(ws: ClientConnection, deadline: float) -> list[dict[str, Any]]:
    """The events of one response, up to its terminal event (bounded by `deadline`)."""
    events: list[dict[str, Any]] = []
    while not events or events[-1]["type"] not in ("response.completed", "response.failed", "error"):
        events.append(orjson.loads(ws.recv(timeout=max(deadline - time.monotonic(), 0.01))))
    return events


def test_sigterm_during_a_websocket_response_lets_it_finish_then_closes_1001(start_mock):
    """The Responses WebSocket mode (docs/responses.md "WebSocket mode"): SIGTERM while a response streams on an open
    WebSocket lets that response finish within shutdown_grace, then the proxy closes the connection with 1001
    (going away). An idle WebSocket is closed with 1001 at once."""
    mock = start_mock("openai")
    proc, url = start_cli(mock.url, 10.0)
    t0 = time.monotonic()
    ws_url = url.replace("http://", "ws://") + "/v1/responses"
    try:
        with connect(ws_url, open_timeout=10) as ws, connect(ws_url, open_timeout=10) as idle:
            ws.send(orjson.dumps({"type": "response.create", "model": "m",
                                  "input": "[mock:chunks=30][mock:delay_ms=40]"}).decode())
            first = orjson.loads(ws.recv(timeout=10))
            assert first["type"] == "response.created"
            proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            with pytest.raises(ConnectionClosed) as idle_closed:
                idle.recv(timeout=10)
            assert idle_closed.value.rcvd is not None and idle_closed.value.rcvd.code == 1001
            assert time.monotonic() - signalled < 1.0  # at once: the other's response takes 30 x 40 ms
            events = [first, *_ws_events(ws, t0 + 20)]
            assert events[-1]["type"] == "response.completed", events[-1]
            text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
            assert text == " ".join(f"tok{i}" for i in range(30))
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001, closed.value
        assert time.monotonic() - t0 < 10  # 30 x 40 ms: finished well within the grace, not cut at its end
        _, err = proc.communicate(timeout=15)
        assert proc.returncode in (0, -signal.SIGTERM)
        assert "Traceback" not in err.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def test_sigterm_grace_over_fails_the_websocket_response_then_closes_1001(start_mock):
    """A WebSocket response still running when shutdown_grace is over ends with `response.failed` (`shutting_down`),
    as an SSE stream ends with its error event; then the connection closes with 1001."""
    mock = start_mock("openai")
    proc, url = start_cli(mock.url, 0.5)
    t0 = time.monotonic()
    try:
        with connect(url.replace("http://", "ws://") + "/v1/responses", open_timeout=10) as ws:
            ws.send(orjson.dumps({"type": "response.create", "model": "m",
                                  "input": "[mock:chunks=400][mock:delay_ms=25]"}).decode())
            first = orjson.loads(ws.recv(timeout=10))
            proc.send_signal(signal.SIGTERM)
            events = [first, *_ws_events(ws, t0 + 20)]
            assert events[-1]["type"] == "response.failed", events[-1]
            assert events[-1]["response"]["error"]["code"] == "shutting_down"
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001, closed.value
        assert time.monotonic() - t0 < 8  # 400 x 25 ms would take 10 s: it was cut at the grace period
        _, err = proc.communicate(timeout=15)
        assert proc.returncode in (0, -signal.SIGTERM)
        assert "Traceback" not in err.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
