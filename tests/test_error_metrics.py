"""Metrics for operators, on the running proxy in front of the mock: errors counted by the code the client got
(dialect_proxy_errors_total), no `_created` series, no per-key series without inbound keys, and the exposition
passes `promtool check metrics` (deploy/METRICS.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import Mock
from tests.test_gateway import metric
from tests.test_metrics import promtool_check_metrics

CHAT = "/v1/chat/completions"


def ask(client: openai.OpenAI, text: str, model: str = "m") -> None:
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}])


def test_errors_are_counted_by_the_code_the_client_got(start_mock: Callable[..., Mock],
                                                       start_proxy: Callable[..., Any]) -> None:
    proxy = start_proxy(mock=start_mock("openai"), models=["m"])
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="none", max_retries=0, timeout=30)
    ask(client, "hello")
    ask(client, "hello again")
    for _ in range(3):
        with pytest.raises(openai.NotFoundError) as missing:
            ask(client, "hi", model="gpt-nobody-serves")
    assert missing.value.body["code"] == "model_not_found"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as unsupported:
        client.responses.create(model="m", input="hi", background=True)
    assert unsupported.value.body["code"] == "unsupported_parameter"  # type: ignore[index]
    for _ in range(2):
        with pytest.raises(openai.RateLimitError) as limited:
            ask(client, "[mock:error=429]")
    assert limited.value.body["code"] == "rate_limited"  # type: ignore[index]
    with pytest.raises(openai.APIStatusError) as broken:
        ask(client, "[mock:error=500]")
    assert broken.value.status_code == 502 and broken.value.body["code"] == "bad_gateway"  # type: ignore[index]
    bad = httpx.post(proxy.url + CHAT, content=b"{not json", timeout=10,
                     headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    client.close()

    name = "dialect_proxy_errors_total"
    assert metric(proxy, name, route=CHAT, upstream="none", code="model_not_found") == 3
    assert metric(proxy, name, route="/v1/responses", code="unsupported_parameter") == 1
    assert metric(proxy, name, route=CHAT, upstream="mock-openai", code="rate_limited") == 2
    assert metric(proxy, name, route=CHAT, upstream="mock-openai", code="bad_gateway") == 1
    assert metric(proxy, name, route=CHAT, code="invalid_json") == 1
    assert metric(proxy, name) == 8  # every error once, nothing for the two answers
    assert metric(proxy, "dialect_proxy_requests_total", outcome="error") == 8

    text = httpx.get(proxy.url + "/metrics", timeout=10).content
    assert b"_created" not in text
    assert b"dialect_proxy_key_" not in text  # no inbound keys: no per-key series repeating the totals
    promtool_check_metrics(text)


def test_refused_keys_are_counted_and_named_keys_have_their_series(
        start_mock: Callable[..., Mock], start_proxy: Callable[..., Any], tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("team-a: sk-aaa\n")
    proxy = start_proxy(mock=start_mock("openai"), server={"api_keys_file": str(keys)})
    with openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-aaa", max_retries=0, timeout=30) as good:
        ask(good, "hello")
    with openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-wrong", max_retries=0, timeout=30) as wrong:
        for _ in range(2):
            with pytest.raises(openai.AuthenticationError):
                ask(wrong, "hello")
    assert httpx.get(proxy.url + "/v1/models", timeout=10).status_code == 401

    name = "dialect_proxy_errors_total"
    assert metric(proxy, name, route=CHAT, upstream="none", code="invalid_api_key") == 2
    assert metric(proxy, name, route="other", upstream="none", code="invalid_api_key") == 1
    assert metric(proxy, "dialect_proxy_key_requests_total", key="team-a", status="2xx") == 1
    text = httpx.get(proxy.url + "/metrics", timeout=10).content
    assert b'key="none"' not in text and b"_created" not in text
    promtool_check_metrics(text)
