"""Connections never exceed what the process can open (proxy/server/frontend.py `connection_limit`): the proxy runs in
its own process with RLIMIT_NOFILE lowered to 128, 150 half-open client connections (some silent, some with half a
head) take every slot it has, and normal requests meanwhile get a clean 503 envelope or an answer — never a broken
connection — and answers again once the half-open connections are gone."""

from __future__ import annotations

import resource
import socket
import time
from collections.abc import Callable

import httpx
import pytest

from tests.conftest import Mock, serve_process

NOFILE = 128
HALF_OPEN = 150


def _lower_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


def ask(url: str) -> tuple[int | None, dict[str, object] | str]:
    """One chat request on a fresh connection: (status, JSON body), or (None, what broke)."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    try:
        with httpx.Client(timeout=10) as client:
            r = client.post(url + "/v1/chat/completions", json=body)
            return r.status_code, r.json()
    except (httpx.HTTPError, ValueError) as e:
        return None, f"{type(e).__name__}: {e}"


def test_half_open_connections_cannot_exhaust_descriptors(start_mock: Callable[..., Mock]) -> None:
    mock = start_mock("openai")
    args = ["--upstream-url", mock.url, "--upstream-dialect", "openai", "--header-timeout", "60"]
    with serve_process(args, preexec_fn=_lower_nofile) as url:
        assert ask(url)[0] == 200
        held: list[socket.socket] = []
        try:
            for i in range(HALF_OPEN):
                sock = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=5)
                held.append(sock)
                if i % 2:
                    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # half a head
            time.sleep(2.5)  # the refused ones have been answered and have stopped lingering
            results = [ask(url) for _ in range(5)]
            for status, body in results:
                assert status in (200, 503), results
                if status == 503:
                    assert isinstance(body, dict) and body["error"]["code"] == "too_many_connections"  # type: ignore[index]
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + 10
        results = []
        while time.monotonic() < deadline:
            results = [ask(url) for _ in range(5)]
            if all(status == 200 for status, _ in results):
                break
            time.sleep(0.2)
        assert all(status == 200 for status, _ in results), results


@pytest.mark.parametrize(("soft", "configured", "expected"), [(128, 2048, (128 - 32) * 4 // 9), (1 << 20, 2048, 2048),
                                                             (256, 50, 50)])
def test_the_limit_is_derived_from_rlimit_nofile(soft: int, configured: int, expected: int,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from proxy.server import frontend

    monkeypatch.setattr(frontend.resource, "getrlimit", lambda _: (soft, soft))
    assert frontend.connection_limit(configured) == expected
