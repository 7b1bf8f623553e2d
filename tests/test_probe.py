"""`dialect-proxy probe`: against every built-in mock flavour, over plain HTTP, TLS and mutual TLS (certificates made
by openssl), and through the command line. The config block it prints must be accepted by the proxy's settings."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.probe.runner import ProbeOptions, Report, probe
from proxy.settings import build_settings
from tests.conftest import ServerThread, free_port
from tests.test_tls import pki  # noqa: F401  (the module-scoped certificate fixture)

ROOT = Path(__file__).resolve().parent.parent
MOCK_MODELS = {"openai": ["mock-gpt"], "mindie": ["mindie-mock"], "siliconstorm": ["DeepSeek-R1"],
               "deepseek": ["deepseek-flash", "deepseek-v4-flash", "deepseek-v4-pro"], "engine": []}


def run_probe(url: str, **kw: Any) -> Report:
    return asyncio.run(probe(ProbeOptions(url=url, timeout=10, **kw)))


def accepted_config(report: Report) -> dict[str, Any]:
    """The printed block is valid YAML that the proxy's settings take as it is."""
    config = yaml.safe_load(report.config)
    settings = build_settings(config=config, environ={"UPSTREAM_API_KEY": "k", "DS_KEY": "k"})
    assert settings.upstreams[0].dialect == report.dialect
    entry: dict[str, Any] = config["upstreams"][0]
    return entry


@pytest.mark.parametrize(("dialect", "full_text"), [
    ("openai", False), ("mindie", False), ("mindie", True), ("siliconstorm", True), ("deepseek", False),
    ("engine", False),
])
def test_detects_every_mock_flavour(start_mock, dialect: str, full_text: bool) -> None:
    mock = start_mock(dialect, full_text=full_text)
    report = run_probe(mock.url)
    assert report.reachable and report.tls == "none"
    assert report.dialect == dialect, report.dialect_evidence
    assert report.models == MOCK_MODELS[dialect]
    assert report.full_text is full_text
    assert report.chat == "ok"
    assert report.tool_calls == "streamed"
    # MindIE puts usage on its finish chunk (and so does DeepSeek, as seen in the wild); OpenAI-style servers send
    # a final `choices: []` chunk when asked with stream_options.
    assert report.usage == ("finish_chunk" if dialect in ("mindie", "siliconstorm", "deepseek") else "final_chunk")
    assert report.requests <= 6
    assert not report.problems
    entry = accepted_config(report)
    assert entry["url"] == mock.url
    assert entry.get("full_text", False) is full_text
    # Structured output: the MindIE mock imitates MindIE >= 2.3 (honoured), Siliconstorm ignores response_format.
    expected = {"mindie": "honoured", "siliconstorm": "ignored"}.get(dialect, "untested")
    assert report.response_format == expected
    assert entry.get("response_format") == ("pass" if expected == "honoured" else None)


def test_url_with_v1_and_the_engine_without_model_listing(start_mock) -> None:
    mock = start_mock("engine")
    report = run_probe(mock.url + "/v1/")
    assert report.dialect == "engine" and report.paths["GET /v1/models"] == 404
    assert "POST /chat" in report.paths
    assert accepted_config(report)["url"] == mock.url


@pytest.mark.parametrize(("directive", "expected"), [
    ("[mock:think]", "tags"), ("[mock:think_close_only]", "close_only"), ("[mock:reasoning_field]", "field"),
    ("", "none"),
])
def test_reasoning_forms(start_mock, directive: str, expected: str) -> None:
    mock = start_mock("mindie", full_text=True)
    report = run_probe(mock.url, prompt=f"Hello {directive}", max_tokens=200)
    assert report.reasoning == expected


def test_close_only_on_an_unlisted_model_name_goes_into_thinking_models(start_mock) -> None:
    mock = start_mock("openai")
    report = run_probe(mock.url, prompt="Hello [mock:think_close_only]", max_tokens=200)
    assert report.reasoning == "close_only"
    assert accepted_config(report)["thinking_models"] == ["mock-gpt"]


def test_tool_calls_without_index(start_mock) -> None:
    mock = start_mock("mindie")
    # the tool request carries its own message; the prompt directive applies to the first request only
    report = run_probe(mock.url, dialect="mindie")
    assert report.tool_calls == "streamed" and report.dialect_evidence == ["given with --dialect"]


def test_api_key_needed(start_mock) -> None:
    mock = start_mock("deepseek", api_key="sk-right")
    report = run_probe(mock.url)
    assert report.api_key_required
    assert any("api_key_env" in p["hint"] for p in report.problems)
    assert accepted_config(report)["api_key_env"] == "UPSTREAM_API_KEY"
    good = run_probe(mock.url, api_key="sk-right", api_key_env="DS_KEY")
    assert good.dialect == "deepseek" and good.chat == "ok" and not good.problems
    assert accepted_config(good)["api_key_env"] == "DS_KEY"


def test_unreachable_says_unknown_and_prints_no_config_block() -> None:
    report = run_probe(f"http://127.0.0.1:{free_port()}")
    assert not report.reachable and report.dialect is None
    assert report.problems and "not reachable" in report.problems[0]["problem"]
    assert "host and port" in report.problems[0]["hint"]  # each failure names its fix
    data = report.to_json()
    for key in ("dialect", "api_key_required", "full_text", "reasoning", "usage", "tool_calls"):
        assert data[key] is None, key
    assert report.config == ""
    table = report.render()
    assert "api key          unknown" in table and "full text        unknown" in table
    assert "no config block" in table and "dialect: openai" not in table


def test_engine_answering_openai_shaped_404s_is_found_through_chat(start_mock) -> None:
    """The engine API answers every OpenAI path with an OpenAI-shaped 404 (the mock does too): that shape is no
    evidence of the OpenAI dialect; /chat is tried before a verdict."""
    mock = start_mock("engine")
    report = run_probe(mock.url)
    assert report.error_shapes["GET /v1/models"] == "openai" and report.paths["GET /v1/models"] == 404
    assert report.dialect == "engine" and report.chat == "ok"


def test_a_given_dialect_the_server_does_not_speak_is_a_problem(start_mock) -> None:
    mock = start_mock("deepseek")
    report = run_probe(mock.url, dialect="mindie")
    assert any("answers as the deepseek dialect" in p["problem"] and "--dialect deepseek" in p["hint"]
               for p in report.problems), report.problems
    out = cli(mock.url, "--dialect", "mindie")
    assert out.returncode == 1 and "answers as the deepseek dialect" in out.stdout
    same = cli(start_mock("siliconstorm").url, "--dialect", "mindie")  # hosted MindIE: the same wire, no warning
    assert "answers as" not in same.stdout


def test_deepseek_given_to_a_mindie_server_warns_in_the_report_and_the_config_block(start_mock) -> None:
    """--dialect deepseek against MindIE: DeepSeek's own listing path (/models) is a 404 there, yet the generic
    listing shows MindIE, and the block the user may paste says so next to `dialect: deepseek`."""
    mock = start_mock("mindie")
    report = run_probe(mock.url, dialect="deepseek")
    assert report.dialect == "deepseek" and report.answers_as == "mindie"
    assert any("answers as the mindie dialect" in p["problem"] and "--dialect mindie" in p["hint"]
               for p in report.problems), report.problems
    config = report.config.splitlines()
    assert "    dialect: deepseek" in config
    assert "    # warning: this server answers as the mindie dialect, not deepseek (--dialect): see the probe's " \
           "problems" in config
    out = cli(mock.url, "--dialect", "deepseek")
    assert out.returncode == 1
    assert "problem: the server answers as the mindie dialect" in out.stdout
    assert "# warning: this server answers as the mindie dialect" in out.stdout
    agreed = run_probe(mock.url, dialect="mindie")
    assert agreed.answers_as is None and "# warning" not in agreed.config and not agreed.problems


def test_mindie_block_suggests_health_url_on_the_management_port(start_mock) -> None:
    report = run_probe(start_mock("mindie").url)
    assert report.dialect == "mindie"
    assert "# health_url: http://127.0.0.1:1026/health" in report.config


def test_https_to_a_plain_port_says_use_http(start_mock) -> None:
    mock = start_mock("openai")
    report = run_probe(mock.url.replace("http://", "https://"))
    assert not report.reachable
    assert "http:// URL" in report.problems[0]["hint"]


@pytest.fixture
def mtls_mindie(pki: Path, servers: list[ServerThread]) -> str:  # noqa: F811
    from proxy.mock import create_app

    srv = ServerThread(create_app("mindie", full_text=True), ssl_keyfile=str(pki / "server.key"),
                       ssl_certfile=str(pki / "server.pem"), ssl_ca_certs=str(pki / "ca.pem"),
                       ssl_cert_reqs=ssl.CERT_REQUIRED).start()
    servers.append(srv)
    return srv.url.replace("http://", "https://")


def test_mutual_tls(mtls_mindie: str, pki: Path) -> None:  # noqa: F811
    ca, cert, key = str(pki / "ca.pem"), str(pki / "client.pem"), str(pki / "client.key")

    plain = run_probe(mtls_mindie.replace("https://", "http://"))
    assert not plain.reachable and plain.tls == "tls"
    assert mtls_mindie in plain.problems[0]["hint"]
    assert plain.config == ""  # the dialect was not found: no block built on a guess

    no_ca = run_probe(mtls_mindie, tls_cert_file=cert, tls_key_file=key)
    assert "tls_ca_file" in no_ca.problems[0]["hint"]
    # only the CA was missing: the rest is learnt without verification, the problem stays
    assert no_ca.reachable and no_ca.dialect == "mindie"

    no_cert = run_probe(mtls_mindie, tls_ca_file=ca)
    assert not no_cert.reachable and no_cert.tls == "mutual_tls"
    assert "tls_cert_file" in no_cert.problems[0]["hint"]

    good = run_probe(mtls_mindie, tls_ca_file=ca, tls_cert_file=cert, tls_key_file=key)
    assert good.reachable and good.tls == "mutual_tls" and not good.problems
    assert good.dialect == "mindie" and good.full_text and good.tool_calls == "streamed"
    entry = accepted_config(good)
    assert (entry["tls_ca_file"], entry["tls_cert_file"], entry["tls_key_file"]) == (ca, cert, key)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DIALECT_PROXY_")}
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "proxy", "probe", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=environ)


def test_cli_json_and_table(mtls_mindie: str, pki: Path) -> None:  # noqa: F811
    out = cli(mtls_mindie, "--json", "--tls-ca-file", str(pki / "ca.pem"), "--tls-cert-file",
              str(pki / "client.pem"), "--tls-key-file", str(pki / "client.key"))
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert {"reachable", "tls", "dialect", "models", "full_text", "reasoning", "usage", "config"} <= set(data)
    assert data["dialect"] == "mindie" and data["models"] == ["mindie-mock"] and data["full_text"] is True
    assert data["reasoning"] == "none" and data["usage"] == "finish_chunk" and data["tls"] == "mutual_tls"
    assert yaml.safe_load(data["config"])["upstreams"][0]["dialect"] == "mindie"

    table = cli(mtls_mindie, "--tls-ca-file", str(pki / "ca.pem"))
    assert table.returncode == 1
    assert "tls_cert_file" in table.stdout and "config block" in table.stdout


def test_cli_dialect_and_key_env(start_mock) -> None:
    mock = start_mock("siliconstorm", api_key="sk-secret-value")
    out = cli(mock.url, "--dialect", "SiliconStorm", "--api-key-env", "SS_KEY", "--json",
              env={"SS_KEY": "sk-secret-value"})
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads(out.stdout)
    assert data["dialect"] == "siliconstorm" and "sk-secret-value" not in out.stdout
    wrong = cli(mock.url, "--dialect", "mindy")
    assert wrong.returncode == 2 and "did you mean 'mindie'" in wrong.stderr
    pasted = cli(mock.url, "--api-key-env", "sk-secret-value")
    assert pasted.returncode == 2 and "sk-secret-value" not in pasted.stderr and "--api-key-env" in pasted.stderr


@pytest.mark.parametrize(("flavour", "model", "kind"), [
    ("", "BAAI/bge-m3", "embeddings"), ("reranker", "BAAI/bge-reranker-v2-m3", "rerank"),
])
def test_tei_is_recognised_by_its_info_and_gets_a_block_for_its_model_and_kind(start_mock, flavour: str, model: str,
                                                                               kind: str) -> None:
    """TEI lists no models: it names its model and its type on GET /info. No chat request goes to it (the tei
    dialect serves none); the block routes that model here for its kind, and the proxy takes it as it is."""
    mock = start_mock("tei", flavour=flavour, directives="max_batch=16")
    report = run_probe(mock.url)
    assert report.dialect == "tei" and "GET /info: text-embeddings-inference" in report.dialect_evidence[0]
    assert report.models == [model] and report.kinds == [kind]
    assert report.paths == {"GET /v1/models": 404, "GET /models": 404, "GET /info": 200}  # no chat request
    assert report.worked() and not report.problems
    entry = accepted_config(report)
    assert (entry["url"], entry["models"], entry["kinds"]) == (mock.url, [model], [kind])
    assert "    # TEI's max_client_batch_size is 16" in report.config
    assert f"kinds            {kind}" in report.render()
    given = run_probe(mock.url, dialect="tei")
    assert given.dialect_evidence == ["given with --dialect"] and given.kinds == [kind] and not given.problems
    assert yaml.safe_load(given.config) == yaml.safe_load(report.config)


def test_tei_cli_exits_zero_and_prints_the_block(start_mock) -> None:
    mock = start_mock("tei")
    out = cli(mock.url, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads(out.stdout)
    assert data["dialect"] == "tei" and data["kinds"] == ["embeddings"] and data["chat"] == "untested"
    assert yaml.safe_load(data["config"])["upstreams"][0]["models"] == ["BAAI/bge-m3"]


def test_a_tei_classifier_is_recognised_and_refused(start_mock) -> None:
    """A classifier of several classes is TEI's too, but serves neither embeddings nor rerank (/rerank refuses it)."""
    report = run_probe(start_mock("tei", flavour="classifier").url)
    assert report.dialect == "tei" and report.kinds == []
    assert any("no kind the proxy serves" in p["problem"] for p in report.problems), report.problems
    assert not report.worked() and "kinds:" not in report.config


def test_tei_given_as_mindie_warns_and_mindie_given_as_tei_too(start_mock) -> None:
    tei = start_mock("tei")
    report = run_probe(tei.url, dialect="mindie")
    assert report.dialect == "mindie" and report.answers_as == "tei"
    assert any("answers as the tei dialect" in p["problem"] and "--dialect tei" in p["hint"]
               for p in report.problems), report.problems
    assert "    # warning: this server answers as the tei dialect, not mindie (--dialect): see the probe's " \
           "problems" in report.config.splitlines()
    assert "max_client_batch_size" not in report.config and "models:" not in report.config
    out = cli(tei.url, "--dialect", "mindie")
    assert out.returncode == 1 and "answers as the tei dialect" in out.stdout
    mindie = run_probe(start_mock("mindie").url, dialect="tei")
    assert mindie.answers_as == "mindie" and not mindie.worked()
    assert "POST /v1/chat/completions" not in mindie.paths  # the tei dialect is asked for no chat
