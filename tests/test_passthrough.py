"""Native passthrough (docs/passthrough.md): a client dialect an upstream serves natively goes there untranslated.

Real servers on loopback: the built-in OpenAI mock with its Responses API and the DeepSeek mock with its Anthropic
API (proxy/mock/responses_api.py, anthropic_api.py), the proxy in front, driven by the official openai and anthropic
SDKs. What the client gets is compared with what the upstream itself holds; what the upstream received with what the
client sent; the metrics are scraped."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import anthropic
import httpx
import openai
import pytest
from websockets.sync.client import connect

from proxy.settings import ConfigError, build_settings
from tests.conftest import free_port, wait_for
from tests.test_gateway import metric

UPSTREAM_KEY = "sk-upstream-secret"
CLIENT_KEY = "sk-client-key"


def _proxy(start_proxy: Any, upstream: dict[str, Any], **kw: Any) -> Any:
    return start_proxy([{"api_key_env": "UPKEY", **upstream}], server={"api_keys_env": "KEYS"},
                       environ={"UPKEY": UPSTREAM_KEY, "KEYS": CLIENT_KEY}, **kw)


@pytest.fixture
def openai_pair(start_mock: Any, start_proxy: Any) -> tuple[Any, Any]:
    mock = start_mock("openai", api_key=UPSTREAM_KEY)
    proxy = _proxy(start_proxy, {"name": "oai", "dialect": "openai", "url": mock.url,
                                 "passthrough": ["responses", "responses_compact"], "aliases": {"fast": "gpt-mock"}})
    return mock, proxy


def _stored(mock: Any, response_id: str) -> dict[str, Any]:
    """The response as the upstream itself keeps it."""
    data: dict[str, Any] = httpx.get(f"{mock.url}/v1/responses/{response_id}", timeout=5).json()
    return data


# -- Responses to OpenAI --------------------------------------------------------------------------------------------

def test_responses_pass_through_unchanged_with_hosted_tools_and_state(openai_pair: tuple[Any, Any]) -> None:
    mock, proxy = openai_pair
    client = proxy.client()
    first = client.responses.create(
        model="gpt-mock", input="Find the news [mock:cached=5]", tools=[{"type": "web_search"}],
        metadata={"team": "a"}, extra_body={"x_unknown_field": {"kept": True}})
    # The hosted tool ran upstream: its item reached the client (translation would have refused the tool) ...
    assert [item.type for item in first.output] == ["web_search_call", "message"]
    assert first.output_text.startswith("Hello from the mock openai upstream!")
    # ... and the answer is the upstream's own object, field for field (its id, its usage).
    assert first.model_dump(mode="json", exclude_unset=True) == _stored(mock, first.id)
    sent = mock.last_request()
    assert sent["path"] == "/v1/responses"
    assert sent["body"]["x_unknown_field"] == {"kept": True} and sent["body"]["metadata"] == {"team": "a"}
    assert sent["body"]["tools"] == [{"type": "web_search"}]
    # The upstream's key replaced the client's, which never left the proxy.
    assert sent["headers"]["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert CLIENT_KEY not in json.dumps(sent)
    # The conversation state lives upstream: previous_response_id goes there as it is.
    second = client.responses.create(model="gpt-mock", input="And then?", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    assert mock.last_request()["body"]["previous_response_id"] == first.id
    # An alias is the one change to the body: the upstream gets its own model name.
    aliased = client.responses.create(model="fast", input="hi")
    assert mock.last_request()["body"]["model"] == "gpt-mock" and aliased.model == "gpt-mock"
    # Metrics as for any request: counted, tokens with the cached ones.
    assert metric(proxy, "dialect_proxy_requests_total", upstream="oai", status="2xx", outcome="ok") == 3
    assert metric(proxy, "dialect_proxy_tokens_total", upstream="oai", kind="cached") == 5
    prompt = first.usage.input_tokens + second.usage.input_tokens + aliased.usage.input_tokens
    assert metric(proxy, "dialect_proxy_tokens_total", upstream="oai", kind="prompt") == prompt
    assert metric(proxy, "dialect_proxy_tokens_total", upstream="oai", kind="completion") == 3 * 13


def test_responses_stream_bytes_and_ttft(openai_pair: tuple[Any, Any], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dialect_proxy.access")
    mock, proxy = openai_pair
    with proxy.client().responses.create(model="gpt-mock", input="hello", stream=True,
                                         tools=[{"type": "web_search"}]) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert "response.web_search_call.searching" in kinds and kinds[-1] == "response.completed"
    final = events[-1].response
    assert final.model_dump(mode="json", exclude_unset=True) == _stored(mock, final.id)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    # Byte for byte: the raw stream is the upstream's event framing, `event:` lines included.
    with httpx.stream("POST", proxy.base_url + "/responses", timeout=10,
                      headers={"authorization": f"Bearer {CLIENT_KEY}"},
                      json={"model": "gpt-mock", "input": "hello", "stream": True}) as r:
        raw = b"".join(r.iter_bytes())
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    blocks = raw.decode().split("\n\n")
    assert blocks[0].startswith("event: response.created\ndata: {")
    completed = json.loads(next(b for b in blocks if b.startswith("event: response.completed")).split("data: ", 1)[1])
    assert completed["response"] == _stored(mock, completed["response"]["id"])
    assert metric(proxy, "dialect_proxy_time_to_first_token_seconds_count", upstream="oai") == 2
    assert metric(proxy, "dialect_proxy_requests_total", upstream="oai", stream="true", outcome="ok") == 2
    logs = [json.loads(rec.getMessage()) for rec in caplog.records if rec.name == "dialect_proxy.access"]
    assert wait_for(lambda: len(logs) >= 1)
    line = logs[0]
    assert line["passthrough"] is True and line["status"] == 200 and line["ttft_ms"] is not None
    assert line["completion_tokens"] == 13 and line["finish_reason"] == "stop"


def test_responses_background_and_compact_pass_through(openai_pair: tuple[Any, Any]) -> None:
    mock, proxy = openai_pair
    client = proxy.client()
    queued = client.responses.create(model="gpt-mock", input="a long job", background=True)
    assert queued.status == "queued" and mock.last_request()["body"]["background"] is True
    compacted = client.responses.compact(model="gpt-mock", input=[{"role": "user", "content": "hi"}])
    assert mock.last_request()["path"] == "/v1/responses/compact"
    assert compacted.output[-1].type == "compaction"
    assert compacted.output[-1].encrypted_content.startswith("mock-")  # the upstream's, not the proxy's sealing


def test_upstream_errors_pass_through_as_they_are(openai_pair: tuple[Any, Any]) -> None:
    mock, proxy = openai_pair
    client = proxy.client()
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="gpt-mock", input="hi", previous_response_id="resp_unknown")
    assert caught.value.body == {"message": "Previous response with id 'resp_unknown' not found.",
                                 "type": "invalid_request_error", "param": "previous_response_id",
                                 "code": "previous_response_not_found"}
    httpx.post(mock.url + "/_mock/directives", json={"directives": "error=429"}, timeout=5).raise_for_status()
    r = httpx.post(proxy.base_url + "/responses", headers={"authorization": f"Bearer {CLIENT_KEY}"}, timeout=10,
                   json={"model": "gpt-mock", "input": "hi"})
    assert r.status_code == 429 and r.headers["retry-after"] == "7"
    assert r.json()["error"]["message"] == "Rate limit reached for requests"
    assert metric(proxy, "dialect_proxy_requests_total", upstream="oai", status="4xx") == 2


def test_failover_to_a_live_replica_and_proxy_errors_in_the_client_dialect(start_mock: Any,
                                                                          start_proxy: Any) -> None:
    mock = start_mock("openai", api_key=UPSTREAM_KEY)
    dead = f"http://127.0.0.1:{free_port()}"
    proxy = _proxy(start_proxy, {"name": "oai", "dialect": "openai", "url": [dead, mock.url], "retries": 1,
                                 "health_interval": 0, "passthrough": ["responses"]})
    client = proxy.client()
    made = 0
    for i in range(12):  # the balancer may pick the live replica first several times in a row: at most 12 requests
        assert client.responses.create(model="m", input=f"q{i}", stream=i % 2 == 1).__class__.__name__
        made += 1
        if i >= 3 and metric(proxy, "dialect_proxy_upstream_attempts_total", result="unreachable") >= 1:
            break
    assert metric(proxy, "dialect_proxy_upstream_attempts_total", result="ok") == made
    assert metric(proxy, "dialect_proxy_upstream_attempts_total", result="unreachable") >= 1
    assert metric(proxy, "dialect_proxy_retries_total") >= 1
    # No replica left: the proxy's own error, in the Responses dialect (OpenAI's envelope).
    lonely = _proxy(start_proxy, {"name": "gone", "dialect": "openai", "url": dead, "passthrough": ["responses"]})
    with pytest.raises(openai.InternalServerError) as caught:
        lonely.client().responses.create(model="m", input="hi")
    assert caught.value.status_code == 502 and caught.value.body["type"] == "upstream_error"


def test_a_stream_cut_after_its_head_ends_with_the_client_dialects_error(openai_pair: tuple[Any, Any]) -> None:
    mock, proxy = openai_pair
    with pytest.raises(openai.APIError) as caught:
        with proxy.client().responses.create(model="gpt-mock", input="hi [mock:drop=3]", stream=True) as stream:
            for _ in stream:
                pass
    assert "broke" in str(caught.value.message)
    assert metric(proxy, "dialect_proxy_requests_total", upstream="oai", outcome="truncated") == 1


def test_websocket_mode_passes_through_over_http_streams(openai_pair: tuple[Any, Any]) -> None:
    """The Responses WebSocket mode goes through the same endpoint: each `response.create` is a streamed request
    passed through, its upstream events each one message, as they are."""
    mock, proxy = openai_pair
    url = proxy.url.replace("http://", "ws://") + "/v1/responses"
    with connect(url, additional_headers={"authorization": f"Bearer {CLIENT_KEY}"}) as ws:
        events: list[dict[str, Any]] = []
        ws.send(json.dumps({"type": "response.create", "model": "gpt-mock", "input": "hi",
                            "tools": [{"type": "web_search"}]}))
        deadline = time.monotonic() + 30
        while not events or events[-1]["type"] not in ("response.completed", "response.failed", "error"):
            events.append(json.loads(ws.recv(timeout=max(deadline - time.monotonic(), 0.01))))
    assert events[-1]["type"] == "response.completed"
    assert "response.web_search_call.searching" in [e["type"] for e in events]
    assert events[-1]["response"] == _stored(mock, events[-1]["response"]["id"])
    assert mock.last_request()["body"]["stream"] is True


# -- Messages to DeepSeek's Anthropic API ---------------------------------------------------------------------------

@pytest.fixture
def deepseek_pair(start_mock: Any, start_proxy: Any) -> tuple[Any, Any, anthropic.Anthropic]:
    mock = start_mock("deepseek", api_key=UPSTREAM_KEY)
    proxy = _proxy(start_proxy, {"name": "ds", "dialect": "deepseek", "url": mock.url, "passthrough": "messages"})
    client = anthropic.Anthropic(base_url=proxy.url, api_key=CLIENT_KEY, max_retries=0, timeout=30)
    yield mock, proxy, client
    client.close()


def test_messages_pass_through_to_deepseek(deepseek_pair: tuple[Any, Any, anthropic.Anthropic]) -> None:
    mock, proxy, client = deepseek_pair
    message = client.messages.create(model="deepseek-v4-pro", max_tokens=256,
                                     messages=[{"role": "user", "content": "hi [mock:cached=6]"}],
                                     thinking={"type": "enabled", "budget_tokens": 128},
                                     extra_body={"x_unknown_field": 1}, extra_headers={"anthropic-beta": "mock-beta"})
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.usage.cache_read_input_tokens == 6 and message.stop_reason == "end_turn"
    sent = mock.last_request()
    assert sent["path"] == "/anthropic/v1/messages" and sent["body"]["x_unknown_field"] == 1
    assert sent["headers"]["x-api-key"] == UPSTREAM_KEY and "authorization" not in sent["headers"]
    assert sent["headers"]["anthropic-beta"] == "mock-beta" and sent["headers"]["anthropic-version"]  # as sent
    assert CLIENT_KEY not in json.dumps(sent)
    with client.messages.stream(model="deepseek-v4-pro", max_tokens=256,
                                messages=[{"role": "user", "content": "hi [mock:cached=4]"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text.startswith("Hello from the mock deepseek upstream!") and final.usage.output_tokens == 13
    assert metric(proxy, "dialect_proxy_tokens_total", upstream="ds", kind="cached") == 10
    assert metric(proxy, "dialect_proxy_tokens_total", upstream="ds", kind="completion") == \
        message.usage.output_tokens + 13
    assert metric(proxy, "dialect_proxy_time_to_first_token_seconds_count", upstream="ds") == 1
    assert metric(proxy, "dialect_proxy_finish_reasons_total", upstream="ds", reason="stop") == 2


def test_messages_errors_upstream_and_proxy(deepseek_pair: tuple[Any, Any, anthropic.Anthropic],
                                           start_proxy: Any) -> None:
    mock, proxy, client = deepseek_pair
    httpx.post(mock.url + "/_mock/directives", json={"directives": "error=529"}, timeout=5).raise_for_status()
    with pytest.raises(anthropic.APIStatusError) as caught:
        client.messages.create(model="deepseek-v4-pro", max_tokens=64, messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 529
    assert caught.value.body == {"type": "error", "error": {"type": "overloaded_error", "message": "Mock error 529"}}
    dead = _proxy(start_proxy, {"name": "ds", "dialect": "deepseek", "url": f"http://127.0.0.1:{free_port()}",
                                "passthrough": ["messages"]})
    with anthropic.Anthropic(base_url=dead.url, api_key=CLIENT_KEY, max_retries=0, timeout=30) as other:
        with pytest.raises(anthropic.APIStatusError) as caught:
            other.messages.create(model="deepseek-v4-pro", max_tokens=64, messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 502 and caught.value.body["error"]["type"] == "api_error"
    assert caught.value.body["request_id"] == caught.value.response.headers["x-request-id"]  # the proxy's own error


def test_other_routes_and_dialects_still_translate(deepseek_pair: tuple[Any, Any, anthropic.Anthropic]) -> None:
    mock, proxy, _ = deepseek_pair
    chat = proxy.client().chat.completions.create(model="deepseek-v4-pro",
                                                  messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].message.content and mock.last_request()["path"] == "/chat/completions"


# -- settings -------------------------------------------------------------------------------------------------------

def test_passthrough_names_what_the_spoke_serves() -> None:
    def build(dialect: str, value: Any) -> Any:
        return build_settings(config={"upstreams": [{"dialect": dialect, "url": "http://127.0.0.1:1",
                                                     "passthrough": value}]}, environ={})

    with pytest.raises(ConfigError, match=r"upstreams\[0\]\.passthrough: 'messages' is not a client dialect the "
                                          r"openai dialect serves natively \(it serves: responses, "
                                          r"responses_compact\)"):
        build("openai", ["messages"])
    with pytest.raises(ConfigError, match=r"upstreams\[0\]\.passthrough: .* \(it serves: none\)"):
        build("mindie", ["responses"])
    assert build("openai", True).upstreams[0].passthrough == ("responses", "responses_compact")
    assert build("deepseek", "messages").upstreams[0].passthrough == ("messages",)
    assert build("openai", None).upstreams[0].passthrough == ()
