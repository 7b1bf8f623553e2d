"""One redaction for every URL that leaves the proxy's memory (proxy/settings.py `redact_url`, applied to URLs inside
any text by proxy/gateway/redact.py): user info and credential-like query parameters never reach a log line, an error
message, /readyz or a trace. The proxy is fed upstream URLs carrying each credential, on loopback."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from proxy.gateway.redact import Redactor, redact_urls
from proxy.settings import redact_url, url_secrets
from tests.conftest import Mock, free_port, wait_for
from tests.otlp_receiver import Receiver
from tests.test_tracing import otel_env, spans_of, traceparent

# Each credential-like query parameter, spelt as an operator might (case, `-` for `_`), with a value of its own.
PARAMS = ("key", "api_key", "apikey", "API-KEY", "token", "access_token", "Refresh_Token", "sig", "signature",
          "password", "secret", "client_secret", "auth", "Authorization", "x-goog-api-key")
VALUES = {name: f"Cred{n}x{name.replace('-', '').replace('_', '')}Q7" for n, name in enumerate(PARAMS)}
USER, PASSWORD = "alice7user", "Pa55wordOfAlice"
QUERY = "&".join(f"{name}={value}" for name, value in VALUES.items()) + "&db=1&model=kept"
SECRETS = (*VALUES.values(), USER, PASSWORD)


def leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text or s.lower() in text.lower()]


def test_redact_url_replaces_user_info_and_every_credential_parameter() -> None:
    url = f"https://{USER}:{PASSWORD}@llm.example:8443/v1?{QUERY}#frag"
    shown = redact_url(url)
    assert leaks(shown) == []
    assert shown.startswith("https://***@llm.example:8443/v1?key=***&api_key=***")
    assert shown.endswith("&db=1&model=kept#frag")  # what is not a credential stays, for the operator
    assert set(url_secrets(url)) >= {*VALUES.values(), PASSWORD}
    text = f"GET {url} failed; retry {url.replace('https', 'http')}"
    assert leaks(redact_urls(text)) == [] and leaks(Redactor().secrets(text)) == []


@pytest.fixture
def proxy_log() -> Iterator[list[str]]:
    """Every line of the proxy's loggers (the access log too), with any traceback."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(logging.Formatter().format(record))

    loggers = [logging.getLogger(name) for name in ("dialect_proxy", "dialect_proxy.access")]
    handler = Keep()
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    yield lines
    for logger, level in zip(loggers, levels, strict=True):
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_no_path_leaks_a_credential_of_an_upstream_url(
    start_mock: Callable[..., Mock], start_proxy: Callable[..., Any], proxy_log: list[str],
) -> None:
    receiver = Receiver().start()
    try:
        _run_every_path(start_mock, start_proxy, proxy_log, receiver)
    finally:
        receiver.stop()


def _run_every_path(start_mock: Callable[..., Mock], start_proxy: Callable[..., Any], proxy_log: list[str],
                    receiver: Receiver) -> None:
    mock = start_mock("openai")
    with_creds = mock.url.replace("http://", f"http://{USER}:{PASSWORD}@")
    closed = f"http://{USER}:{PASSWORD}@127.0.0.1:{free_port()}"  # nothing listens: connection errors
    proxy = start_proxy([
        # The query makes the mock answer 404 (an upstream error); the health URL carries the credentials too.
        {"name": "answers", "dialect": "openai", "url": f"{with_creds}/v1?{QUERY}", "models": ["up"],
         "health_url": f"{with_creds}/health?{QUERY}"},
        {"name": "down", "dialect": "openai", "url": f"{closed}/v1?{QUERY}", "models": ["down"]},
    ], environ=otel_env(receiver))
    seen: list[str] = []
    # The start-up log: one upstream_check line per upstream.
    assert wait_for(lambda: sum('"upstream_check"' in line for line in proxy_log) >= 2, timeout=15), proxy_log
    header, trace_id, _ = traceparent()
    for model in ("up", "down"):  # an upstream error message; a connection error
        for stream in (False, True):
            resp = httpx.post(proxy.url + "/v1/chat/completions", timeout=20, headers={"traceparent": header},
                              json={"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
            assert resp.status_code >= 400, resp.text
            seen.append(resp.text)
    ready = httpx.get(proxy.url + "/readyz", timeout=20)  # the readiness reasons
    assert ready.status_code == 503
    seen.append(ready.text)
    spans = spans_of(receiver, trace_id, 8)  # a server and a client span per request: the trace attributes
    seen += [repr(span.attributes) for span in spans]
    assert wait_for(lambda: sum('"upstream_unreachable"' in line for line in proxy_log) >= 2)
    assert any('"route"' in line and '"status"' in line for line in proxy_log)  # the access log had its say
    seen += proxy_log
    assert [(where[:300], leaks(where)) for where in seen if leaks(where)] == []
    assert any("***@127.0.0.1" in line for line in proxy_log)  # the address is still there for the operator
