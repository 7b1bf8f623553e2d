"""/readyz means "a request would work": each upstream's inference path for its dialect must exist and take the key
(a deliberately invalid body gets the dialect's validation error; proxy/gateway/health.py), its health_url (if any) must
answer 2xx, and the JSON says why not. Each misconfiguration of issue 37 is here, with the proxy and the mock really
started: not ready, and the client's error names the cause. A start-up log line per upstream says whether it was
ready. TLS mistakes name the setting."""

from __future__ import annotations

import json
import logging
import ssl
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.conftest import ServerThread, free_port, wait_for
from tests.test_tls import pki  # noqa: F401  (the module-scoped certificate fixture)


def readyz(proxy: Any) -> tuple[int, dict[str, Any]]:
    r = httpx.get(proxy.url + "/readyz", timeout=10)
    return r.status_code, r.json()


@pytest.mark.parametrize(("dialect", "status"), [
    ("openai", 400), ("deepseek", 422), ("mindie", 422), ("siliconstorm", 422), ("engine", 400),
])
def test_every_mock_flavour_refuses_the_invalid_body_as_its_dialect_does(start_mock, start_proxy, dialect: str,
                                                                       status: int) -> None:
    mock = start_mock(dialect)
    got, body = readyz(start_proxy(mock=mock))
    check = body["checks"][f"mock-{dialect}"]
    assert got == 200 and check["status"] == status, check
    assert mock.stats()["requests"] == 0


def test_ready_upstream_reports_its_check(start_mock, start_proxy) -> None:
    mock = start_mock("mindie")
    status, body = readyz(start_proxy(mock=mock))
    assert status == 200 and body["upstreams"] == {"mock-mindie": "up"}
    check = body["checks"]["mock-mindie"]
    # MindIE's validation error (422) to the invalid body: the path exists, no key is needed, nothing was generated
    assert check["ready"] and check["status"] == 422 and check["path"] == "/v1/chat/completions"
    assert "validation error" in check["reason"]
    assert mock.url.split("//")[1] not in json.dumps(body)  # the open /readyz shows no address
    stats = mock.stats()
    assert stats["checks"] >= 1 and stats["requests"] == 0 and stats["completed"] == 0


def test_readyz_polling_is_cached(start_mock, start_proxy) -> None:
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock)
    assert readyz(proxy)[0] == 200
    before = mock.stats()["checks"]
    for _ in range(10):
        assert readyz(proxy)[0] == 200
    assert mock.stats()["checks"] - before <= 1


def test_wrong_dialect_or_path_is_not_ready(start_mock, start_proxy) -> None:
    mock = start_mock("openai")
    status, body = readyz(start_proxy([{"name": "x", "dialect": "deepseek", "url": mock.url}]))
    assert status == 503
    check = body["checks"]["x"]
    assert check["reachable"] and not check["ready"] and check["status"] == 404
    assert "dialect (deepseek)" in check["reason"] and "dialect-proxy probe" in check["reason"]
    assert body["upstreams"]["x"].startswith("down: POST /chat/completions")
    status, body = readyz(start_proxy([{"name": "y", "dialect": "openai", "url": mock.url + "/api"}]))
    assert status == 503 and body["checks"]["y"]["status"] == 404


def test_refused_key_is_not_ready(start_mock, start_proxy) -> None:
    mock = start_mock("openai", api_key="sk-right")
    status, body = readyz(start_proxy(mock=mock))
    assert status == 503 and "set api_key_env" in body["checks"]["mock-openai"]["reason"]
    status, body = readyz(start_proxy(mock=mock, api_key_env="K", environ={"K": "sk-wrong"}))
    assert status == 503 and "check the variable named by api_key_env" in body["checks"]["mock-openai"]["reason"]
    status, _ = readyz(start_proxy(mock=mock, api_key_env="K", environ={"K": "sk-right"}))
    assert status == 200


def test_wrong_siliconstorm_key_is_not_ready(start_mock, start_proxy) -> None:
    """Siliconstorm answers a wrong key with `{"code": 801}` at HTTP 200, on GET /v1/models too: an error body at 200
    is a failure."""
    mock = start_mock("siliconstorm", api_key="sk-right")
    proxy = start_proxy(mock=mock, api_key_env="K", environ={"K": "sk-wrong"})
    status, body = readyz(proxy)
    check = body["checks"]["mock-siliconstorm"]
    assert status == 503 and check["status"] == 200 and not check["ready"]
    assert "Apikey error" in check["reason"] and "refused the API key" in check["reason"]
    with pytest.raises(openai.AuthenticationError) as e:
        proxy.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert "Apikey error" in e.value.body["message"]
    good = start_proxy(mock=mock, api_key_env="K", environ={"K": "sk-right"})
    assert readyz(good)[0] == 200


def _ask_every_client_dialect(proxy: Any) -> list[tuple[int, str, str]]:
    """(status, type or code, message) of one request in each client dialect (chat, streamed chat, Responses,
    Messages)."""
    said: list[tuple[int, str, str]] = []
    client = proxy.client()
    msg = [{"role": "user", "content": "hi"}]
    for stream in (False, True):
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(model="m", messages=msg, stream=stream)
        said.append((e.value.status_code, e.value.body["code"], e.value.body["message"]))
    with pytest.raises(openai.APIStatusError) as e:
        client.responses.create(model="m", input="hi")
    said.append((e.value.status_code, e.value.body["code"], e.value.body["message"]))
    with anthropic.Anthropic(base_url=proxy.url, api_key="k", max_retries=0, timeout=30) as claude:
        with pytest.raises(anthropic.APIStatusError) as a:
            claude.messages.create(model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    error = a.value.body["error"]
    said.append((a.value.status_code, error["type"], error["message"]))
    return said


@pytest.mark.parametrize(("mock_dialect", "dialect", "path"), [
    ("mindie", "engine", "/chat"), ("mindie", "deepseek", "/chat/completions"),
])
def test_a_dialect_the_upstream_does_not_speak(start_mock, start_proxy, mock_dialect: str, dialect: str,
                                               path: str) -> None:
    """`--upstream-dialect engine` (or deepseek) in front of MindIE: not ready, and every request is a 502 that names
    the path, the configured dialect and `dialect-proxy probe` — never `model_not_found` (routing found the model)."""
    mock = start_mock(mock_dialect)
    proxy = start_proxy([{"name": "npu", "dialect": dialect, "url": mock.url}])
    status, body = readyz(proxy)
    check = body["checks"]["npu"]
    assert status == 503 and check["status"] == 404 and check["path"] == path
    assert f"dialect ({dialect})" in check["reason"] and "dialect-proxy probe" in check["reason"]
    said = _ask_every_client_dialect(proxy)
    assert [s for s, _, _ in said] == [502] * 4, said
    for _, code, message in said:
        assert code in ("upstream_path_not_found", "api_error") and "model_not_found" not in code
        assert f"POST {path}" in message and f"`{dialect}`" in message and "dialect-proxy probe" in message


def test_model_unknown_upstream_is_still_model_not_found(start_mock, start_proxy) -> None:
    """A 404 that says the model does not exist stays a 404 model_not_found (docs/decisions.md "Errors")."""
    mock = start_mock("openai", served_model="only-this")
    proxy = start_proxy(mock=mock)
    assert readyz(proxy)[0] == 200
    with pytest.raises(openai.NotFoundError) as e:
        proxy.client().chat.completions.create(model="other", messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["code"] == "model_not_found"


def test_health_url_must_answer_2xx(start_mock, start_proxy) -> None:
    mock = start_mock("mindie")
    status, body = readyz(start_proxy(mock=mock, health_url=mock.url + "/v2/health/none"))
    assert status == 503 and "expected 2xx" in body["checks"]["mock-mindie"]["reason"]
    status, body = readyz(start_proxy(mock=mock, health_url=mock.url + "/health"))
    assert status == 200 and "health_url GET /health answered HTTP 200" in body["checks"]["mock-mindie"]["reason"]
    # the health URL answers, the inference path does not: not ready
    status, body = readyz(start_proxy([{"name": "e", "dialect": "engine", "url": mock.url,
                                        "health_url": mock.url + "/health"}]))
    assert status == 503 and body["checks"]["e"]["status"] == 404


def test_health_url_of_plain_text_is_asked_for_anything(start_mock, start_proxy) -> None:
    """An operator's health URL may answer plain text and refuse a request that accepts only JSON (406): the probe
    accepts anything there, where the dialect's own paths ask for JSON."""
    seen: list[str] = []

    async def health(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        accept = dict(scope["headers"]).get(b"accept", b"").decode()
        seen.append(accept)
        status, body = (200, b"OK") if "*/*" in accept or "text/plain" in accept else (406, b"")
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": body})

    mock = start_mock("mindie")
    srv = ServerThread(health).start()
    try:
        status, _ = readyz(start_proxy(mock=mock, health_url=srv.url + "/healthz"))
        assert status == 200 and seen and all(accept == "*/*" for accept in seen)
    finally:
        srv.stop()


def test_engine_is_ready_when_its_chat_path_validates(start_mock, start_proxy) -> None:
    mock = start_mock("engine")
    status, body = readyz(start_proxy(mock=mock))
    assert status == 200 and body["checks"]["mock-engine"]["path"] == "/chat"
    assert body["checks"]["mock-engine"]["status"] == 400
    status, body = readyz(start_proxy([{"name": "e", "dialect": "engine", "url": f"http://127.0.0.1:{free_port()}"}]))
    assert status == 503 and not body["checks"]["e"]["reachable"]


def test_start_up_logs_one_line_per_upstream(start_mock, start_proxy, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dialect_proxy")
    mock = start_mock("openai")
    start_proxy([{"name": "live", "dialect": "openai", "url": mock.url, "models": ["a"]},
                 {"name": "gone", "dialect": "openai", "url": f"http://127.0.0.1:{free_port()}", "models": ["b"]}])

    def lines() -> dict[str, dict[str, Any]]:
        found = {}
        for rec in caplog.records:
            msg = rec.getMessage()
            if '"upstream_check"' in msg:
                data = json.loads(msg)
                found[data["upstream"]] = data
        return found

    assert wait_for(lambda: len(lines()) == 2, timeout=10)
    got = lines()
    assert got["live"]["reachable"] and got["live"]["ready"]
    assert not got["gone"]["reachable"] and "could not be reached" in got["gone"]["detail"]


@pytest.fixture
def mtls_url(pki: Path, servers: list[ServerThread]) -> str:  # noqa: F811
    from proxy.mock import create_app

    srv = ServerThread(create_app("mindie"), ssl_keyfile=str(pki / "server.key"),
                       ssl_certfile=str(pki / "server.pem"), ssl_ca_certs=str(pki / "ca.pem"),
                       ssl_cert_reqs=ssl.CERT_REQUIRED).start()
    servers.append(srv)
    return srv.url.replace("http://", "https://")


@pytest.mark.parametrize(("mistake", "setting"), [
    ("no_ca", "tls_ca_file"), ("no_client_cert", "tls_cert_file"), ("plain_http", "https://"),
])
def test_tls_mistakes_name_the_setting(mtls_url: str, pki: Path, start_proxy, mistake: str,  # noqa: F811
                                       setting: str) -> None:
    up: dict[str, Any] = {"name": "npu", "dialect": "mindie", "url": mtls_url, "tls_ca_file": str(pki / "ca.pem"),
                          "tls_cert_file": str(pki / "client.pem"), "tls_key_file": str(pki / "client.key")}
    if mistake == "no_ca":
        del up["tls_ca_file"]
    elif mistake == "no_client_cert":
        del up["tls_cert_file"], up["tls_key_file"]
    else:
        up["url"] = mtls_url.replace("https://", "http://")
    proxy = start_proxy([up])
    with pytest.raises(openai.APIStatusError) as e:
        proxy.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 502 and setting in e.value.body["message"]
    status, body = readyz(proxy)
    assert status == 503 and setting in body["checks"]["npu"]["reason"]
