"""A dialect is declared once (docs/dialects.md): the spokes' registries are the only list of dialects, and every list
derived from them agrees — the settings accept exactly the registry's names, the mock serves every one, the metrics'
`dialect` label holds them, the compiled build covers every spoke, the probe has one fallback — and no dialect name is
written as a string outside its spoke."""

from __future__ import annotations

import ast
from pathlib import Path

import httpx
import pytest

from proxy import mock
from proxy.clients import CLIENT_DIALECTS
from proxy.dialects import DIALECTS, SHARED, family
from proxy.metrics import labels as metrics
from proxy.settings import ConfigError, build_settings, dialect_name, usage_field_names
from tests.test_build import _compiled_list

ROOT = Path(__file__).resolve().parent.parent


def test_the_registry_is_the_spoke_files() -> None:
    spokes = {p.stem for p in (ROOT / "proxy" / "dialects").glob("*.py")} - {"__init__", *SHARED}
    assert set(DIALECTS) == spokes
    for name, spoke in DIALECTS.items():
        assert spoke.name == name and spoke.__module__ == f"proxy.dialects.{name}"
        assert (ROOT / "mappings" / f"{name}.yaml").is_file(), name
    assert {p.stem for p in (ROOT / "mappings").glob("*.yaml")} == set(DIALECTS)
    assert family("siliconstorm") == "mindie" and family("mindie") == "mindie" and family("openai") == "openai"


def test_settings_accept_exactly_the_registry_names() -> None:
    for name in DIALECTS:
        assert dialect_name("dialect", name.upper()) == name
    with pytest.raises(ConfigError) as caught:
        build_settings(config={"upstreams": [{"dialect": "mindy", "url": "http://127.0.0.1:1"}]}, environ={})
    assert str(caught.value) == (f"upstreams[0].dialect: 'mindy' is not one of {', '.join(DIALECTS)} "
                                 "(did you mean 'mindie'?)")
    assert set(usage_field_names()) == {name for name, spoke in DIALECTS.items() if spoke.offers_usage_fields}
    assert {"openai", "deepseek"} <= set(usage_field_names())
    with pytest.raises(ConfigError, match="client.usage_fields: 'engine' is not one of"):
        build_settings(config={"upstreams": [{"dialect": "engine", "url": "http://127.0.0.1:1"}],
                               "client": {"usage_fields": "engine"}}, environ={})


def test_metrics_label_and_compiled_build_follow_the_registry() -> None:
    assert metrics.DIALECTS == {*DIALECTS, "any"}
    compiled = set(_compiled_list())
    for spoke in DIALECTS.values():
        assert f"proxy/dialects/{spoke.__module__.rsplit('.', 1)[1]}.py" in compiled


def test_the_probe_has_one_fallback_and_every_error_shape_one_owner() -> None:
    assert [name for name, spoke in DIALECTS.items() if spoke.probe.generic] == ["openai"]
    shapes = {"openai": {"error": {"message": "m", "type": "t"}}, "mindie": {"error": "m", "error_type": "t"},
              "siliconstorm": {"code": 801, "result": None, "message": "Apikey error"}}
    for owner, body in shapes.items():
        assert [name for name, spoke in DIALECTS.items() if spoke.probe.error_shape(body)] == [owner]


def test_the_mock_serves_every_dialect_and_the_proxy_speaks_it(start_mock, start_proxy) -> None:
    """Each registered dialect, for real: its mock flavour behind the proxy, one chat request by the OpenAI SDK."""
    assert set(mock.DIALECTS) == set(DIALECTS)
    for name in DIALECTS:
        upstream = start_mock(name)
        proxy = start_proxy(mock=upstream)
        if DIALECTS[name]().path("chat") is None:  # a retrieval spoke (no chat): one embeddings request
            assert len(proxy.client().embeddings.create(model="m", input="Hi").data) == 1, name
            assert upstream.stats()["requests"] == 1
            continue
        reply = proxy.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}])
        assert reply.choices[0].message.content == f"Hello from the mock {name} upstream! 你好, 世界 🌍.", name
        assert upstream.stats()["requests"] == 1


def test_every_client_dialect_is_mounted(start_mock, start_proxy) -> None:
    assert {"chat", "completions", "responses", "responses_compact", "messages"} <= set(CLIENT_DIALECTS)
    proxy = start_proxy(mock=start_mock("openai"))
    with httpx.Client(base_url=proxy.url, timeout=10) as client:
        for name, cls in CLIENT_DIALECTS.items():
            answer = client.post(cls.path, content=b"[]", headers={"Content-Type": "application/json"})
            assert answer.status_code == 400, (name, answer.status_code, answer.text)


def test_no_dialect_name_is_written_outside_its_spoke() -> None:
    """No string constant in proxy/ (but the spokes and the mock) is a dialect's name: any list of dialects there
    would be a second one."""
    found = []
    for path in sorted((ROOT / "proxy").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("proxy/dialects/", "proxy/mock/")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in DIALECTS:
                found.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert not found
