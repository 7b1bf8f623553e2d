"""End to end: the official openai SDK -> proxy (uvicorn, loopback) -> built-in mock OpenAI upstream (uvicorn)."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from tests.conftest import wait_for

MSG = [{"role": "user", "content": "Say hello"}]


def direct(mock):
    """An SDK client straight to the mock upstream (use as a context manager so its socket is closed)."""
    return openai.OpenAI(base_url=mock.url + "/v1", api_key="x", max_retries=0, timeout=30)


def test_non_stream_matches_direct_upstream(start_mock, start_proxy):
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock)
    with direct(mock) as d:
        want = d.chat.completions.create(model="m1", messages=MSG)
    got = proxy.client().chat.completions.create(model="m1", messages=MSG)
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.choices[0].message.content
    assert got.choices[0].finish_reason == "stop"
    assert got.model == "m1"
    assert got.id.startswith("chatcmpl-")
    assert got.usage is not None and got.usage.total_tokens == want.usage.total_tokens


def test_stream_relays_true_deltas_role_once_and_usage_per_stream_options(start_mock, start_proxy):
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock)
    with direct(mock) as d:
        want = d.chat.completions.create(model="m1", messages=MSG).choices[0].message.content
    chunks = list(proxy.client().chat.completions.create(
        model="m1", messages=MSG, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want
    roles = [c.choices[0].delta.role for c in chunks if c.choices and c.choices[0].delta.role]
    assert roles == ["assistant"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1

    # Without include_usage: no usage chunk, and no `usage` key at all in the raw events.
    raw = httpx.post(proxy.base_url + "/chat/completions", json={"model": "m1", "messages": MSG, "stream": True},
                     timeout=30)
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/event-stream")
    assert '"usage"' not in raw.text
    assert raw.text.rstrip().endswith("data: [DONE]")


def test_a_fast_stream_is_counted_event_by_event(start_mock, start_proxy):
    """A zero-delay stream reaches the proxy many events to a read, and the text events of a read go to the chat
    encoder as one run each (proxy/hub/pipeline.py `runs`): still one chunk per upstream event for the client, and one
    token each for the metrics (a time to first token, then an inter-token latency for every later one)."""
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock)
    msg = [{"role": "user", "content": "count [mock:chunks=300]"}]
    with direct(mock) as d:
        want = [c.choices[0].delta.content for c in d.chat.completions.create(model="m1", messages=msg, stream=True)
                if c.choices and c.choices[0].delta.content]
    got = [c.choices[0].delta.content for c in proxy.client().chat.completions.create(
        model="m1", messages=msg, stream=True) if c.choices and c.choices[0].delta.content]
    assert got == want and len(got) >= 300
    counts = {}
    for line in httpx.get(proxy.url + "/metrics", timeout=10).text.splitlines():
        for name in ("time_to_first_token_seconds_count", "inter_token_latency_seconds_count"):
            if line.startswith("dialect_proxy_" + name) and 'upstream="mock-openai"' in line:
                counts[name] = float(line.rsplit(" ", 1)[1])
    assert counts == {"time_to_first_token_seconds_count": 1, "inter_token_latency_seconds_count": len(got) - 1}


def test_stream_helper_accumulates(start_mock, start_proxy):
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock)
    with proxy.client().chat.completions.stream(model="m1", messages=MSG) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert final.choices[0].message.role == "assistant"
    assert final.choices[0].message.content


def test_unknown_fields_pass_through_both_ways(start_mock, start_proxy):
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock)
    messages = [{"role": "user", "content": "hi [mock:extra_fields]"}]
    got = proxy.client().chat.completions.create(
        model="m1", messages=messages, extra_body={"x_custom_param": {"k": [1, 2]}, "top_k": 5})
    sent = mock.last_request()["body"]
    assert sent["x_custom_param"] == {"k": [1, 2]} and sent["top_k"] == 5
    assert got.model_extra.get("x_vendor") is not None
    raw = httpx.post(proxy.base_url + "/chat/completions", timeout=30,
                     json={"model": "m1", "messages": messages, "stream": True}).text
    assert "x_vendor" in raw


def test_alias_routes_and_rewrites_model(start_mock, start_proxy):
    mock = start_mock("openai")
    proxy = start_proxy([{"name": "u", "dialect": "openai", "url": mock.url + "/v1/", "models": ["real-model"],
                          "aliases": {"gpt-4o": "real-model"}}])
    got = proxy.client().chat.completions.create(model="gpt-4o", messages=MSG)
    assert mock.last_request()["body"]["model"] == "real-model"
    assert got.model == "gpt-4o"
    ids = {m.id for m in proxy.client().models.list()}
    assert ids == {"gpt-4o", "real-model"}
    with pytest.raises(openai.NotFoundError) as e:
        proxy.client().chat.completions.create(model="nope", messages=MSG)
    assert e.value.body["code"] == "model_not_found"


def test_models_lists_upstream_when_none_configured(start_mock, start_proxy):
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock)
    with direct(mock) as d:
        direct_ids = {m.id for m in d.models.list()}
    assert direct_ids and {m.id for m in proxy.client().models.list()} == direct_ids


def test_models_never_errors_for_upstream_without_models_endpoint(start_mock, start_proxy):
    mock = start_mock("engine")
    proxy = start_proxy(mock=mock)
    assert [m.id for m in proxy.client().models.list()] == ["mock-engine"]  # its name (tests/test_models_list.py)


def test_bad_requests(start_mock, start_proxy):
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock, server={"max_body_bytes": 2000})
    r = httpx.post(proxy.base_url + "/chat/completions", content=b"{not json", timeout=10)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    assert r.headers["x-should-retry"] == "false"
    r = httpx.post(proxy.base_url + "/chat/completions", timeout=10,
                   json={"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]})
    assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError):
        proxy.client().chat.completions.create(model="m", messages=[])
    assert mock.stats()["requests"] == 0


def test_upstream_refused_is_502_and_unreachable_stream_is_not_200(start_proxy):
    from tests.conftest import free_port

    proxy = start_proxy([{"name": "dead", "dialect": "openai", "url": f"http://127.0.0.1:{free_port()}"}])
    with pytest.raises(openai.InternalServerError) as e:
        proxy.client().chat.completions.create(model="m", messages=MSG)
    assert e.value.status_code == 502
    assert "Traceback" not in e.value.response.text
    with pytest.raises(openai.InternalServerError) as e:
        proxy.client().chat.completions.create(model="m", messages=MSG, stream=True)
    assert e.value.status_code == 502


def test_upstream_timeout_is_504(start_mock, start_proxy):
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock, server={"first_byte_timeout": 0.5})
    with pytest.raises(openai.APIStatusError) as e:
        proxy.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "[mock:hang]"}])
    assert e.value.status_code == 504 and e.value.body["type"] == "timeout_error"


def test_upstream_http_errors_keep_status_and_message(start_mock, start_proxy):
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock)
    with pytest.raises(openai.RateLimitError) as e:
        proxy.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "[mock:error=429]"}])
    assert e.value.status_code == 429
    with pytest.raises(openai.RateLimitError):
        proxy.client().chat.completions.create(
            model="m", stream=True, messages=[{"role": "user", "content": "[mock:error=429]"}])


def test_dropped_connection_mid_stream_raises_in_sdk(start_mock, start_proxy):
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock)
    got = []
    with pytest.raises(openai.APIError):
        for c in proxy.client().chat.completions.create(
                model="m", stream=True, messages=[{"role": "user", "content": "[mock:chunks=10][mock:drop=3]"}]):
            got.append(c)
    assert got  # some content arrived before the error


def test_upstream_key_is_sent_but_never_leaked(start_mock, start_proxy):
    mock = start_mock("openai", api_key="sk-upstream-secret")
    proxy = start_proxy(mock=mock, api_key_env="UP_KEY", environ={"UP_KEY": "sk-upstream-secret"})
    got = proxy.client().chat.completions.create(model="m", messages=MSG)
    assert got.choices[0].message.content
    assert mock.last_request()["headers"]["authorization"] == "Bearer sk-upstream-secret"
    r = httpx.post(proxy.base_url + "/chat/completions", timeout=10,
                   json={"model": "m", "messages": [{"role": "user", "content": "[mock:error=500]"}]})
    assert r.status_code == 502 and "sk-upstream-secret" not in r.text
    assert "sk-upstream-secret" not in httpx.get(proxy.url + "/metrics").text


def test_client_disconnect_mid_stream_closes_upstream_within_a_second(start_mock, start_proxy):
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock)
    with httpx.stream("POST", proxy.base_url + "/chat/completions", timeout=30, json={
            "model": "m", "stream": True,
            "messages": [{"role": "user", "content": "[mock:chunks=200][mock:delay_ms=50]"}]}) as r:
        it = r.iter_lines()
        assert next(it).startswith("data:")
        assert mock.stats()["in_flight"] == 1
    closed = time.monotonic()
    assert wait_for(lambda: mock.stats()["disconnects"] == 1, timeout=1.0)
    assert time.monotonic() - closed < 1.0


def test_client_disconnect_before_first_byte_cancels_upstream(start_mock, start_proxy):
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock)
    for stream in (False, True):
        mock.reset()
        with pytest.raises(openai.APITimeoutError):
            proxy.client(timeout=0.5).chat.completions.create(
                model="m", stream=stream, messages=[{"role": "user", "content": "[mock:first_byte_ms=30000]"}])
        assert wait_for(lambda: mock.stats()["disconnects"] == 1, timeout=1.5), mock.stats()


def test_stream_is_relayed_as_it_arrives(start_mock, start_proxy):
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock)

    async def run() -> tuple[float, float]:
        client = proxy.async_client()
        t0 = time.monotonic()
        first = None
        stream = await client.chat.completions.create(
            model="m", stream=True, messages=[{"role": "user", "content": "[mock:chunks=20][mock:delay_ms=50]"}])
        async for c in stream:
            if first is None and c.choices and c.choices[0].delta.content:
                first = time.monotonic() - t0
        await client.close()
        return first or 99.0, time.monotonic() - t0

    first, total = asyncio.run(run())
    assert total > 0.9  # 20 pieces, 50 ms apart
    assert first < total / 3


def test_completions_endpoint_stream_and_not(start_mock, start_proxy):
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock)
    with direct(mock) as d:
        want = d.completions.create(model="m", prompt="Once upon").choices[0].text
    got = proxy.client().completions.create(model="m", prompt="Once upon")
    assert got.choices[0].text == want and got.id.startswith("cmpl-")
    text = "".join(c.choices[0].text for c in proxy.client().completions.create(
        model="m", prompt="Once upon", stream=True) if c.choices)
    assert text == want


def test_health_and_readiness(start_mock, start_proxy):
    from tests.conftest import free_port

    mock = start_mock("openai")
    proxy = start_proxy(mock=mock)
    assert httpx.get(proxy.url + "/healthz").json()["status"] == "ok"
    r = httpx.get(proxy.url + "/readyz")
    assert r.status_code == 200 and r.json()["upstreams"] == {"mock-openai": "up"}
    dead = start_proxy([{"name": "dead", "dialect": "openai", "url": f"http://127.0.0.1:{free_port()}"}])
    assert httpx.get(dead.url + "/healthz").status_code == 200
    r = httpx.get(dead.url + "/readyz")
    assert r.status_code == 503 and r.json()["upstreams"]["dead"].startswith("down")
    custom = start_proxy([{"name": "h", "dialect": "openai", "url": mock.url, "health_url": mock.url + "/health"}])
    assert httpx.get(custom.url + "/readyz").status_code == 200
    # a health URL that answers does not make an upstream whose inference path cannot be reached ready
    away = start_proxy([{"name": "h", "dialect": "openai", "url": f"http://127.0.0.1:{free_port()}",
                         "health_url": mock.url + "/health"}])
    assert httpx.get(away.url + "/readyz").status_code == 503
    two = [{"name": "live", "dialect": "openai", "url": mock.url, "models": ["a"]},
           {"name": "gone", "dialect": "openai", "url": f"http://127.0.0.1:{free_port()}", "models": ["b"]}]
    assert httpx.get(start_proxy(two).url + "/readyz").status_code == 503  # ready_when: all (default)
    r = httpx.get(start_proxy(two, server={"ready_when": "any"}).url + "/readyz")
    assert r.status_code == 200 and r.json()["upstreams"]["gone"].startswith("down")


def test_upstream_requests_name_the_proxy_not_the_client_library(start_mock, start_proxy):
    """The upstream sees `user-agent: dialect-proxy/VERSION` (its logs can tell the proxy's requests apart), never the
    client's own user agent nor aiohttp's, and the JSON headers of a chat request."""
    from proxy import __version__

    mock = start_mock("openai")
    proxy = start_proxy(mock=mock)
    proxy.client().chat.completions.create(model="m", messages=MSG, extra_headers={"User-Agent": "my-app/1.0"})
    headers = mock.last_request()["headers"]
    assert headers["user-agent"] == f"dialect-proxy/{__version__}"
    assert headers["content-type"] == "application/json" and headers["accept"] == "application/json"
    streamed = proxy.client().chat.completions.create(model="m", messages=MSG, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    headers = mock.last_request()["headers"]
    assert headers["user-agent"] == f"dialect-proxy/{__version__}" and headers["accept"] == "text/event-stream"
    assert headers["content-type"] == "application/json"


def test_request_id_is_returned_and_forwarded_and_access_log_is_one_json_line(start_mock, start_proxy, caplog):
    import json
    import logging

    mock = start_mock("openai")
    proxy = start_proxy(mock=mock)
    caplog.set_level(logging.INFO, logger="dialect_proxy.access")
    raw = proxy.client().chat.completions.with_raw_response.create(
        model="m", messages=MSG, extra_headers={"x-request-id": "req-abc-123"})
    assert raw.headers["x-request-id"] == "req-abc-123"
    assert mock.last_request()["headers"]["x-request-id"] == "req-abc-123"
    generated = proxy.client().chat.completions.with_raw_response.create(model="m", messages=MSG)
    assert len(generated.headers["x-request-id"]) >= 16
    assert mock.last_request()["headers"]["x-request-id"] == generated.headers["x-request-id"]
    again = proxy.client().chat.completions.with_raw_response.create(model="m", messages=MSG)
    assert again.headers["x-request-id"] != generated.headers["x-request-id"]  # a new one per request
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "dialect_proxy.access"]
    first = next(line for line in lines if line["request_id"] == "req-abc-123")
    assert first["status"] == 200 and first["upstream"] == "mock-openai" and first["model"] == "m"
    assert first["finish_reason"] == "stop" and first["completion_tokens"] > 0 and first["duration_ms"] > 0
    assert first["client_disconnected"] is False and first["ttft_ms"] is None  # non-stream: no TTFT
    list(proxy.client().chat.completions.create(model="m", messages=MSG, stream=True,
                                                extra_headers={"x-request-id": "req-stream-1"}))
    from tests.conftest import wait_for  # the line is written just after the last byte was sent

    assert wait_for(lambda: "req-stream-1" in caplog.text)
    streamed = next(json.loads(r.getMessage()) for r in caplog.records
                    if r.name == "dialect_proxy.access" and "req-stream-1" in r.getMessage())
    assert 0 < streamed["ttft_ms"] <= streamed["duration_ms"] and streamed["stream"] is True
    assert "Say hello" not in caplog.text  # no bodies by default


def test_log_bodies_logs_request_bodies_with_secrets_redacted(start_mock, start_proxy, caplog):
    import json
    import logging

    mock = start_mock("openai")
    proxy = start_proxy(mock=mock, server={"log_bodies": True})
    caplog.set_level(logging.DEBUG, logger="dialect_proxy")
    proxy.client().chat.completions.create(model="m", messages=MSG, max_tokens=7,
                                           extra_body={"metadata": {"api_key": "sk-leak-me"}})
    logged = [json.loads(r.getMessage()) for r in caplog.records
              if r.name == "dialect_proxy" and "client_body" in r.getMessage()]
    assert logged and logged[0]["client_body"]["messages"] == MSG
    assert logged[0]["client_body"]["max_tokens"] == 7  # *_tokens are not secrets
    assert "sk-leak-me" not in caplog.text and "[redacted]" in caplog.text


def test_upstream_connections_are_reused(start_mock, start_proxy):
    import shutil
    import subprocess

    if shutil.which("ss") is None:
        pytest.skip("`ss` (iproute2) is not installed")
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock)
    port = mock.url.rsplit(":", 1)[1]
    client = proxy.client()
    for stream in (False, True, False):
        for _ in range(10):
            if stream:
                list(client.chat.completions.create(model="m", messages=MSG, stream=True))
            else:
                client.chat.completions.create(model="m", messages=MSG)
    sockets = [line.split() for line in
               subprocess.run(["ss", "-tan"], capture_output=True, text=True, timeout=10).stdout.splitlines()]
    # Connections the proxy closed itself sit in TIME-WAIT with the upstream as their peer (column 5). Kept-alive
    # reuse leaves none; a connection per request would leave ~30. (The upstream closing idle connections itself,
    # after its keep-alive timeout, shows with the upstream as the local side and is not counted.)
    closed_by_proxy = [f for f in sockets if len(f) >= 5 and f[0] == "TIME-WAIT" and f[4].endswith(f":{port}")]
    assert len(closed_by_proxy) <= 2, closed_by_proxy


def test_client_api_keys_when_configured(start_mock, start_proxy):
    import openai as sdk

    mock = start_mock("openai")
    proxy = start_proxy(mock=mock, server={"api_keys_env": "PROXY_KEYS"},
                        environ={"PROXY_KEYS": "sk-team-a, sk-team-b"})
    with pytest.raises(sdk.AuthenticationError) as e:
        proxy.client().chat.completions.create(model="m", messages=MSG)  # the fixture's client sends sk-client-key
    assert e.value.status_code == 401 and e.value.body["type"] == "authentication_error"
    assert e.value.response.headers["x-should-retry"] == "false"
    assert mock.stats()["requests"] == 0
    with sdk.OpenAI(base_url=proxy.base_url, api_key="sk-team-b", max_retries=0) as good:
        assert good.chat.completions.create(model="m", messages=MSG).choices[0].message.content
        assert list(good.models.list())
    assert httpx.get(proxy.base_url + "/models").status_code == 401
    assert httpx.get(proxy.url + "/healthz").status_code == 200  # probes and scrapes stay open
    assert httpx.get(proxy.url + "/metrics").status_code == 200


def test_client_leaving_while_sending_its_body_is_quiet(start_mock, start_proxy, caplog):
    import json
    import logging
    import socket

    mock = start_mock("openai")
    proxy = start_proxy(mock=mock)
    caplog.set_level(logging.INFO, logger="dialect_proxy")
    host, port = proxy.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"x-request-id: half-body\r\nContent-Length: 1000\r\n\r\n{\"model\": \"m\"")
    assert wait_for(lambda: any("half-body" in r.getMessage() for r in caplog.records), timeout=3)
    line = next(json.loads(r.getMessage()) for r in caplog.records if "half-body" in r.getMessage())
    assert line["status"] == 499 and line["client_disconnected"] is True
    assert mock.stats()["requests"] == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
