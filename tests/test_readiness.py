"""/readyz means it: each upstream must answer its dialect's model/health path (or its health_url) with 2xx, and the
JSON says why not. A start-up log line per upstream says whether it was reachable. TLS mistakes name the setting."""

from __future__ import annotations

import json
import logging
import ssl
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import ServerThread, free_port, wait_for
from tests.test_tls import pki  # noqa: F401  (the module-scoped certificate fixture)


def readyz(proxy: Any) -> tuple[int, dict[str, Any]]:
    r = httpx.get(proxy.url + "/readyz", timeout=10)
    return r.status_code, r.json()


def test_ready_upstream_reports_its_check(start_mock, start_proxy) -> None:
    mock = start_mock("mindie")
    status, body = readyz(start_proxy(mock=mock))
    assert status == 200 and body["upstreams"] == {"mock-mindie": "up"}
    check = body["checks"]["mock-mindie"]
    assert check["ready"] and check["status"] == 200 and check["path"] == "/v1/models"
    assert mock.url.split("//")[1] not in json.dumps(body)  # the open /readyz shows no address


def test_wrong_dialect_or_path_is_not_ready(start_mock, start_proxy) -> None:
    mock = start_mock("openai")
    status, body = readyz(start_proxy([{"name": "x", "dialect": "deepseek", "url": mock.url}]))
    assert status == 503
    check = body["checks"]["x"]
    assert check["reachable"] and not check["ready"] and check["status"] == 404
    assert "dialect (deepseek)" in check["reason"] and "dialect-proxy probe" in check["reason"]
    assert body["upstreams"]["x"].startswith("down: GET ")
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


def test_health_url_must_answer_2xx(start_mock, start_proxy) -> None:
    mock = start_mock("mindie")
    status, body = readyz(start_proxy(mock=mock, health_url=mock.url + "/v2/health/none"))
    assert status == 503 and "expected 2xx" in body["checks"]["mock-mindie"]["reason"]
    status, _ = readyz(start_proxy(mock=mock, health_url=mock.url + "/health"))
    assert status == 200


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


def test_engine_without_health_path_is_ready_when_reachable(start_mock, start_proxy) -> None:
    status, body = readyz(start_proxy(mock=start_mock("engine")))
    assert status == 200 and "no health path" in body["checks"]["mock-engine"]["reason"]
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
