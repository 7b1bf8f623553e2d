"""TLS to the upstream: a MindIE mock served over https with mutual TLS (httpsEnabled), certificates made here."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import openai
import pytest

from proxy.settings import ConfigError, build_settings
from tests.conftest import ServerThread


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    d = tmp_path_factory.mktemp("pki")
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
                "-days", "2", "-subj", f"/CN={ca}", cwd=d)
    for name, ext in (("server", ["-extfile", "san.cnf"]), ("client", [])):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}", cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "2", *ext, cwd=d)
    return d


def test_mutual_tls_upstream(pki: Path, servers: list[ServerThread], start_proxy) -> None:
    from proxy.mock import create_app

    srv = ServerThread(create_app("mindie"), ssl_keyfile=str(pki / "server.key"),
                       ssl_certfile=str(pki / "server.pem"), ssl_ca_certs=str(pki / "ca.pem"),
                       ssl_cert_reqs=ssl.CERT_REQUIRED).start()
    servers.append(srv)
    url = srv.url.replace("http://", "https://")
    good = start_proxy([{"name": "npu", "dialect": "mindie", "url": url, "tls_ca_file": str(pki / "ca.pem"),
                         "tls_cert_file": str(pki / "client.pem"), "tls_key_file": str(pki / "client.key")}])
    answer = good.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content
    streamed = list(good.client().chat.completions.create(
        model="m", stream=True, messages=[{"role": "user", "content": "hi"}]))
    assert streamed[-1].choices[0].finish_reason == "stop"

    no_client_cert = start_proxy([{"name": "npu", "dialect": "mindie", "url": url,
                                   "tls_ca_file": str(pki / "ca.pem")}])
    with pytest.raises(openai.InternalServerError) as e:
        no_client_cert.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 502

    wrong_ca = start_proxy([{"name": "npu", "dialect": "mindie", "url": url,
                             "tls_ca_file": str(pki / "other-ca.pem"), "tls_cert_file": str(pki / "client.pem"),
                             "tls_key_file": str(pki / "client.key")}])
    with pytest.raises(openai.InternalServerError) as e:
        wrong_ca.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 502 and "certificate" in e.value.body["message"].lower()


def test_bad_tls_files_stop_start_up(pki: Path, tmp_path: Path) -> None:
    up = {"dialect": "mindie", "url": "https://127.0.0.1:1025"}
    with pytest.raises(ConfigError, match=r"upstreams\[0\].tls_ca_file: no such file"):
        build_settings(config={"upstreams": [{**up, "tls_ca_file": str(tmp_path / "nope.pem")}]}, environ={})
    with pytest.raises(ConfigError, match="needs both tls_cert_file and tls_key_file"):
        build_settings(config={"upstreams": [{**up, "tls_cert_file": str(pki / "client.pem")}]}, environ={})
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(ConfigError, match="cannot load the TLS files"):
        build_settings(config={"upstreams": [{**up, "tls_ca_file": str(tmp_path / "junk.pem")}]}, environ={})


def test_the_engine_metrics_port_is_read_with_the_upstreams_tls(pki: Path, servers: list[ServerThread],
                                                                start_proxy) -> None:
    """MindIE with httpsEnabled serves its metrics port with mutual TLS too: the sidecar reads it with the upstream's
    tls_* options (docs/inference-gateway.md); with the wrong CA the gauges are missing, not zeros."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from proxy.mock import create_app
    from proxy.mock.server import create_metrics_app
    from tests.conftest import wait_for

    tls = {"ssl_keyfile": str(pki / "server.key"), "ssl_certfile": str(pki / "server.pem"),
           "ssl_ca_certs": str(pki / "ca.pem"), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    app = create_app("mindie")
    engine, metrics = ServerThread(app, **tls).start(), ServerThread(create_metrics_app(app), **tls).start()
    servers.extend((engine, metrics))
    upstream = {"name": "npu", "dialect": "mindie", "url": engine.url.replace("http://", "https://"),
                "metrics_url": metrics.url.replace("http://", "https://") + "/metrics",
                "tls_cert_file": str(pki / "client.pem"), "tls_key_file": str(pki / "client.key")}

    def shown(proxy) -> dict[str, float]:
        """The proxy's /metrics: each sample name with the sum of its values."""
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(httpx.get(proxy.url + "/metrics", timeout=5).text):
            for sample in family.samples:
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
        return out

    good = start_proxy([{**upstream, "tls_ca_file": str(pki / "ca.pem")}], server={"pool_member": True})
    assert wait_for(lambda: "vllm:kv_cache_usage_perc" in shown(good), timeout=5)
    wrong_ca = start_proxy([{**upstream, "tls_ca_file": str(pki / "other-ca.pem")}], server={"pool_member": True})
    assert wait_for(lambda: shown(wrong_ca).get("dialect_proxy_engine_metrics_failures_total", 0) >= 1, timeout=5)
    assert not any(name.startswith("vllm:") for name in shown(wrong_ca))
