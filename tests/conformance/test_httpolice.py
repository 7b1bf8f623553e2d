"""The front end's HTTP/1.1, judged by a tool the project did not write: HTTPolice (PyPI `HTTPolice`, an HTTP message
linter after RFC 7230-7235) reads the raw TCP streams of real connections to the proxy, both directions, frames them
with its own parser and checks every answer. `make test-http` installs it into .venv-httpolice (its pinned
`bitstring` is older than anything the proxy's environment would want) and runs this file; without it, it skips.

Each connection is one case on loopback: keep-alive and pipelined requests (non-stream, stream, HEAD, 404, a bad
body), `Expect: 100-continue`, a chunked request body, HTTP/1.0, and the front end's own refusals (431 headers too
large, 400 malformed, 400 unsupported upgrade, 408 header timeout, 503 connection cap). A case passes when HTTPolice
finds exactly the answers expected, in order, no notice on any answer but the one allowed (ANSWER_ALLOWED) and no
error on the exchange (notices on the requests we send broken on purpose are the point of those requests, not
findings). It found that the front end's own refusals (431, 400, 408, 503) had no `Date` header (RFC 9110 6.6.1).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Proxy

ROOT = Path(__file__).resolve().parent.parent.parent
PYTHON = os.environ.get("HTTPOLICE_PYTHON", str(ROOT / ".venv-httpolice" / "bin" / "python"))
CHECK = Path(__file__).with_name("httpolice_check.py")
HOST = b"Host: 127.0.0.1\r\nUser-Agent: conformance\r\n"
CHAT = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
STREAM = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
HEADER_TIMEOUT = 0.5
CONNECTIONS = 3


def post(body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\n" + HOST + b"Content-Type: application/json\r\n"
            + b"Content-Length: %d\r\n" % len(body) + extra + b"\r\n" + body)


def read_all(sock: socket.socket, deadline: float) -> bytes:
    data = b""
    while time.monotonic() < deadline:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            chunk = sock.recv(65536)
        except (TimeoutError, ConnectionResetError):
            break
        if not chunk:
            break
        data += chunk
    return data


# The one notice an answer may carry: 1277, "obsolete 'X-' prefix" (a comment): x-request-id and x-should-retry are the
# names the OpenAI SDKs read (README.md, docs/decisions.md). Any other notice, error or comment, fails.
ANSWER_ALLOWED = {1277}
# HTTPolice's notices that a request stream is cut short (1006 malformed request heading, 1008 a response left
# without a request to pair it with): expected where the case sends an incomplete request on purpose; the answer is
# then checked on its own.
CUT_SHORT = {1006, 1008}


class Case:
    def __init__(self, name: str, statuses: list[int], cut_short: bool = False) -> None:
        self.name, self.statuses, self.cut_short = name, statuses, cut_short
        self.sent = b""
        self.received = b""


def exchange(port: int, case: Case, steps: list[bytes | float], seconds: float = 10.0) -> None:
    """Send each step (bytes) or wait (float seconds, reading what comes), then read until the proxy closes."""
    deadline = time.monotonic() + seconds
    with socket.create_connection(("127.0.0.1", port), timeout=seconds) as sock:
        for step in steps:
            if isinstance(step, float):
                case.received += read_all(sock, min(time.monotonic() + step, deadline))
            else:
                sock.sendall(step)
                case.sent += step
        case.received += read_all(sock, deadline)


def cases(port: int) -> list[Case]:
    out: list[Case] = []

    def run(name: str, statuses: list[int], steps: list[bytes | float], cut_short: bool = False) -> None:
        case = Case(name, statuses, cut_short)
        exchange(port, case, steps)
        out.append(case)

    run("keep-alive and pipelined", [200, 200, 200, 200, 404, 400, 200], [
        post(CHAT), post(STREAM), b"GET /v1/models HTTP/1.1\r\n" + HOST + b"\r\n",
        b"HEAD /healthz HTTP/1.1\r\n" + HOST + b"\r\n", b"GET /nope HTTP/1.1\r\n" + HOST + b"\r\n",
        post(b"{bad}"), b"GET /metrics HTTP/1.1\r\n" + HOST + b"Connection: close\r\n\r\n"])
    head, _, body = post(CHAT, b"Expect: 100-continue\r\nConnection: close\r\n").partition(b"\r\n\r\n")
    run("expect 100-continue", [100, 200], [head + b"\r\n\r\n", 0.3, body])
    run("chunked request body", [200], [
        b"POST /v1/chat/completions HTTP/1.1\r\n" + HOST + b"Content-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        + b"%x\r\n%b\r\n" % (10, CHAT[:10]) + b"%x\r\n%b\r\n" % (len(CHAT) - 10, CHAT[10:]) + b"0\r\n\r\n"])
    run("HTTP/1.0", [200], [b"GET /v1/models HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"])
    run("headers too large", [431], [b"GET /v1/models HTTP/1.1\r\n" + HOST + b"X-Big: " + b"a" * 9000 + b"\r\n\r\n"])
    run("malformed header", [400], [b"GET /v1/models HTTP/1.1\r\n" + HOST + b"Bad Name: x\r\n\r\n"])
    run("unsupported upgrade", [400], [b"GET /v1/models HTTP/1.1\r\n" + HOST
                                       + b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
                                       + b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"])
    run("header timeout", [408], [b"GET /v1/models HTTP/1.1\r\n" + HOST, HEADER_TIMEOUT + 1.0], cut_short=True)
    # The cap: CONNECTIONS idle connections held open, then one more.
    holders = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(CONNECTIONS)]
    try:
        time.sleep(0.1)
        run("connection cap", [503], [b"GET /v1/models HTTP/1.1\r\n" + HOST + b"\r\n"])
    finally:
        for sock in holders:
            sock.close()
    return out


def test_httpolice_finds_no_error_in_the_front_ends_answers(start_mock: Callable[..., Any],
                                                            start_proxy: Callable[..., Proxy],
                                                            tmp_path: Path) -> None:
    if not os.path.exists(PYTHON):
        pytest.skip(f"HTTPolice is not installed at {PYTHON} (`make test-http` installs it into .venv-httpolice)")
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock, server={"max_header_bytes": 8192, "header_timeout": HEADER_TIMEOUT,
                                           "max_client_connections": CONNECTIONS})
    done = cases(proxy.srv.port)
    paths: list[str] = []
    for i, case in enumerate(done):
        req, resp = tmp_path / f"{i}.req", tmp_path / f"{i}.resp"
        req.write_bytes(case.sent)
        resp.write_bytes(case.received)
        paths += [str(req), str(resp)]
    run = subprocess.run([PYTHON, str(CHECK), *paths], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    found: list[list[dict[str, Any]]] = json.loads(run.stdout)
    assert len(found) == len(done)
    for case, exchanges in zip(done, found, strict=True):
        statuses = [r["status"] for e in exchanges for r in e["responses"]]
        assert statuses == case.statuses, (case.name, statuses, case.received[:300])
        errors = [(e["request"], r["status"], n) for e in exchanges for r in e["responses"] for n in r["notices"]
                  if n["id"] not in ANSWER_ALLOWED]
        errors += [(e["request"], n) for e in exchanges for n in e["exchange_notices"] if n["severity"] == "error"
                   and not (case.cut_short and n["id"] in CUT_SHORT)]
        assert errors == [], (case.name, errors)
