"""OpenTelemetry (proxy/metrics/tracing.py, docs/observability.md): the proxy on loopback in front of the mock,
configured with the standard OTEL_* variables, exporting over OTLP/HTTP to a loopback receiver (tests/otlp_receiver.py)
that decodes what arrives. Driven with the official SDKs; what the spans say is checked against what the client got."""

from __future__ import annotations

import json
import logging
import os
import secrets
from typing import Any

import anthropic
import httpx
import openai
import pytest

from proxy.settings import ConfigError, build_settings
from tests.conftest import free_port, serve_process, wait_for
from tests.otlp_receiver import Receiver, Span


@pytest.fixture
def receiver() -> Any:
    r = Receiver().start()
    yield r
    r.stop()


def otel_env(receiver: Receiver, **extra: str) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50",
            "OTEL_METRIC_EXPORT_INTERVAL": "200", "OTEL_SERVICE_NAME": "proxy-under-test", **extra}


def traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def spans_of(receiver: Receiver, trace_id: str, count: int) -> list[Span]:
    assert wait_for(lambda: len(receiver.trace(trace_id)) >= count, timeout=10), receiver.trace(trace_id)
    return receiver.trace(trace_id)


def one(spans: list[Span], kind: str) -> Span:
    found = [s for s in spans if s.kind == kind]
    assert len(found) == 1, spans
    return found[0]


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "dialect_proxy.access"]


def test_chat_continues_the_clients_trace(receiver, start_mock, start_proxy, caplog) -> None:
    caplog.set_level(logging.INFO, logger="dialect_proxy.access")
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock, environ=otel_env(receiver))
    header, trace_id, client_span = traceparent()
    answer = proxy.client().chat.completions.create(
        model="gpt-test", messages=[{"role": "user", "content": "hi"}], temperature=0.3, max_tokens=50,
        extra_headers={"traceparent": header})
    spans = spans_of(receiver, trace_id, 2)
    server, client = one(spans, "SERVER"), one(spans, "CLIENT")
    # The client's trace goes on: our server span is its span's child, the upstream attempt ours.
    assert server.parent_id == client_span
    assert client.parent_id == server.span_id
    assert server.start <= client.start <= client.end <= server.end
    assert server.name == "chat gpt-test" and client.name == "chat gpt-test"
    assert server.resource["service.name"] == "proxy-under-test"
    # The upstream got our attempt's context (the mock records the traceparent it received).
    assert mock.last_request()["traceparent"] == f"00-{trace_id}-{client.span_id}-01"
    # The GenAI attributes say what the client got.
    usage = answer.usage
    assert usage is not None
    for span in (server, client):
        a = span.attributes
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "openai"
        assert a["gen_ai.request.model"] == "gpt-test"
        assert a["gen_ai.usage.input_tokens"] == usage.prompt_tokens
        assert a["gen_ai.usage.output_tokens"] == usage.completion_tokens
        assert a["gen_ai.response.finish_reasons"] == [answer.choices[0].finish_reason]
        assert "error.type" not in a
    assert server.attributes["gen_ai.response.id"] == answer.id
    assert server.attributes["gen_ai.response.model"] == answer.model
    assert server.attributes["gen_ai.request.temperature"] == 0.3
    assert server.attributes["gen_ai.request.max_tokens"] == 50
    assert server.attributes["http.response.status_code"] == 200
    assert client.attributes["server.address"] == "127.0.0.1"
    assert client.attributes["server.port"] == mock.srv.port
    assert client.attributes["http.response.status_code"] == 200
    # Content only on request: none by default.
    assert not any(k.startswith(("gen_ai.input", "gen_ai.output.messages")) for s in spans for k in s.attributes)
    # The access log line names the trace and our server span.
    assert wait_for(lambda: len(access_lines(caplog)) == 1)
    line = access_lines(caplog)[0]
    assert (line["trace_id"], line["span_id"]) == (trace_id, server.span_id)


def test_stream_time_to_first_chunk_and_metrics(receiver, start_mock, start_proxy) -> None:
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock, environ=otel_env(receiver))
    header, trace_id, _ = traceparent()
    text, usage = [], None
    for chunk in proxy.client().chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi [mock:delay_ms=5]"}], stream=True,
            stream_options={"include_usage": True}, extra_headers={"traceparent": header}):
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    assert text and usage is not None
    spans = spans_of(receiver, trace_id, 2)
    server, client = one(spans, "SERVER"), one(spans, "CLIENT")
    assert server.attributes["gen_ai.request.stream"] is True
    for span in (server, client):
        assert 0 < span.attributes["gen_ai.response.time_to_first_chunk"] < (span.end - span.start) / 1e9
        assert span.attributes["gen_ai.usage.output_tokens"] == usage.completion_tokens
    # The GenAI metrics arrive over OTLP too, with the same token counts.
    def points(name: str) -> list[tuple[dict[str, Any], Any]]:
        return receiver.points.get(name, [])

    assert wait_for(lambda: all(points(n) for n in (
        "gen_ai.client.token.usage", "gen_ai.client.operation.duration", "gen_ai.server.request.duration",
        "gen_ai.server.time_to_first_token", "gen_ai.server.time_per_output_token")), timeout=10)
    outputs = [p for attrs, p in points("gen_ai.client.token.usage") if attrs["gen_ai.token.type"] == "output"]
    assert outputs[-1].sum == usage.completion_tokens  # cumulative: the last export holds the whole run
    attrs = points("gen_ai.client.operation.duration")[-1][0]
    assert attrs["gen_ai.provider.name"] == "openai" and attrs["server.port"] == mock.srv.port


def test_messages_call_counts_what_anthropic_sdk_reads(receiver, start_mock, start_proxy) -> None:
    mock = start_mock("deepseek")
    proxy = start_proxy(mock=mock, environ=otel_env(receiver))
    header, trace_id, _ = traceparent()
    with anthropic.Anthropic(base_url=proxy.url, api_key="sk-client-key", max_retries=0) as client:
        message = client.messages.create(model="claude-test", max_tokens=100, messages=[
            {"role": "user", "content": "hi"}], extra_headers={"traceparent": header})
    spans = spans_of(receiver, trace_id, 2)
    server, client_span = one(spans, "SERVER"), one(spans, "CLIENT")
    assert server.attributes["http.route"] == "/v1/messages"
    assert server.attributes["gen_ai.response.id"] == message.id
    assert client_span.attributes["gen_ai.provider.name"] == "deepseek"
    for span in (server, client_span):
        assert span.attributes["gen_ai.usage.input_tokens"] == message.usage.input_tokens
        assert span.attributes["gen_ai.usage.output_tokens"] == message.usage.output_tokens


def test_retry_on_a_second_replica_is_two_client_spans(receiver, start_mock, start_proxy) -> None:
    busy = start_mock("openai", directives="error=503")
    good = start_mock("openai")
    proxy = start_proxy([{"name": "up", "dialect": "openai", "url": [busy.url, good.url], "outlier_failures": 0,
                          "health_interval": 0}], environ=otel_env(receiver))
    client = proxy.client()
    for _ in range(20):  # least_outstanding breaks ties at random: the busy replica comes first some times
        header, trace_id, _ = traceparent()
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                       extra_headers={"traceparent": header})
        spans_of(receiver, trace_id, 2)
        if busy.stats()["requests"]:
            break
    spans = spans_of(receiver, trace_id, 3)
    server = one(spans, "SERVER")
    first, second = sorted((s for s in spans if s.kind == "CLIENT"), key=lambda s: s.start)
    assert first.parent_id == second.parent_id == server.span_id
    assert first.attributes["server.port"] == busy.srv.port and second.attributes["server.port"] == good.srv.port
    assert first.attributes["error.type"] == "503" and first.attributes["http.response.status_code"] == 503
    assert first.status == 2 and second.status != 2 and "error.type" not in second.attributes
    assert first.end <= second.start
    assert server.attributes["dialect_proxy.retries"] == 1 and "error.type" not in server.attributes
    assert busy.last_request()["traceparent"] == f"00-{trace_id}-{first.span_id}-01"
    assert good.last_request()["traceparent"] == f"00-{trace_id}-{second.span_id}-01"


def test_upstream_error_sets_error_type(receiver, start_mock, start_proxy) -> None:
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock, environ=otel_env(receiver))
    header, trace_id, _ = traceparent()
    with pytest.raises(openai.APIStatusError) as e:
        proxy.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi [mock:error=500]"}],
                                               extra_headers={"traceparent": header})
    spans = spans_of(receiver, trace_id, 2)
    server, client = one(spans, "SERVER"), one(spans, "CLIENT")
    code = e.value.body["code"] if isinstance(e.value.body, dict) else None  # type: ignore[index]
    assert code
    assert server.attributes["error.type"] == client.attributes["error.type"] == code
    assert server.attributes["http.response.status_code"] == e.value.status_code
    assert client.attributes["http.response.status_code"] == 500
    assert server.status == client.status == 2
    assert "gen_ai.response.id" not in server.attributes


def test_content_is_captured_only_on_request_and_never_a_key(receiver, start_mock, start_proxy) -> None:
    mock = start_mock("openai", api_key="sk-upstream-secret")
    env = otel_env(receiver, OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true",
                   UPSTREAM_KEY="sk-upstream-secret")
    proxy = start_proxy(mock=mock, environ=env, api_key_env="UPSTREAM_KEY")
    header, trace_id, _ = traceparent()
    answer = proxy.client().chat.completions.create(
        model="m", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}],
        extra_headers={"traceparent": header})
    server = one(spans_of(receiver, trace_id, 2), "SERVER")
    inputs = json.loads(server.attributes["gen_ai.input.messages"])
    assert inputs == [{"role": "user", "parts": [{"type": "text", "content": "hi there"}]}]
    assert json.loads(server.attributes["gen_ai.system_instructions"]) == [{"type": "text", "content": "Be brief."}]
    outputs = json.loads(server.attributes["gen_ai.output.messages"])
    assert outputs[0]["parts"] == [{"type": "text", "content": answer.choices[0].message.content}]
    everything = json.dumps([s.attributes for s in receiver.spans] + [s.resource for s in receiver.spans])
    assert "sk-upstream-secret" not in everything and "sk-client-key" not in everything


def test_collector_going_away_loses_no_request_and_bounds_the_queue(start_mock, start_proxy) -> None:
    port = free_port()
    receiver = Receiver(port).start()
    mock = start_mock("openai")
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50",
           "OTEL_BSP_MAX_QUEUE_SIZE": "16", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "8", "OTEL_EXPORTER_OTLP_TIMEOUT": "500",
           "OTEL_METRICS_EXPORTER": "none"}
    proxy = start_proxy(mock=mock, environ=env)
    client = proxy.client()
    state = proxy.srv.server.config.app.state.proxy
    queue = state.telemetry.processor._queue
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "before"}])
    assert wait_for(lambda: len(receiver.spans) >= 2, timeout=10)
    receiver.stop()  # the collector goes away
    try:
        for i in range(150):
            answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"q{i}"}])
            assert answer.choices[0].message.content  # every request is answered
            assert len(queue) <= 16  # the export queue never grows past its bound
        text = httpx.get(proxy.url + "/metrics", timeout=5).text
        dropped = [line for line in text.splitlines() if line.startswith("dialect_proxy_otel_spans_dropped_total")]
        assert sum(float(line.split()[-1]) for line in dropped) > 0, dropped
    finally:
        receiver = Receiver(port).start()  # it comes back: spans flow again
    try:
        header, trace_id, _ = traceparent()
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "after"}],
                                       extra_headers={"traceparent": header})
        assert wait_for(lambda: len(receiver.trace(trace_id)) == 2, timeout=20)
    finally:
        receiver.stop()


def test_off_without_an_endpoint_and_mistakes_stop_start_up(start_mock, start_proxy, caplog) -> None:
    caplog.set_level(logging.INFO, logger="dialect_proxy.access")
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock, environ={"OTEL_SERVICE_NAME": "x"})
    assert proxy.srv.server.config.app.state.proxy.telemetry is None
    proxy.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                           extra_headers={"traceparent": traceparent()[0]})
    assert wait_for(lambda: len(access_lines(caplog)) == 1)
    assert "trace_id" not in access_lines(caplog)[0]
    assert mock.last_request()["traceparent"] is None  # nothing is passed on when tracing is off
    upstreams = [{"name": "u", "dialect": "openai", "url": mock.url}]
    off = build_settings(config={"upstreams": upstreams}, environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
                                                                   "OTEL_SDK_DISABLED": "true"})
    from proxy.metrics.tracing import OtelConfig

    assert not OtelConfig.parse(dict(off.otel)).enabled
    for env, word in ((("OTEL_TRACES_SAMPLER", "sometimes"),), "OTEL_TRACES_SAMPLER"), \
                     ((("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),), "OTEL_EXPORTER_OTLP_PROTOCOL"), \
                     ((("OTEL_EXPORTER_OTLP_HEADERS", "novalue"),), "OTEL_EXPORTER_OTLP_HEADERS"):
        with pytest.raises(ConfigError, match=word):
            build_settings(config={"upstreams": upstreams},
                           environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", **dict(env)})


def test_workers_export_their_own_spans(receiver, start_mock) -> None:
    mock = start_mock("openai")
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50",
           "OTEL_METRICS_EXPORTER": "none"}
    # Two workers need a shared state store (a memory one is refused); chat requests never reach it.
    store = ["--state-store", f"redis://127.0.0.1:{free_port()}/0"]
    with serve_process(["--workers", "2", "--upstream-url", mock.url, "--upstream-dialect", "openai", *store],
                       env) as url:
        ids = []
        with httpx.Client(base_url=url, timeout=10) as http:
            for _ in range(8):
                header, trace_id, parent = traceparent()
                r = http.post("/v1/chat/completions", headers={"traceparent": header},
                              json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
                assert r.status_code == 200
                ids.append((trace_id, parent))
        for trace_id, parent in ids:  # every request's spans arrive, from a worker process (not the parent)
            server = one(spans_of(receiver, trace_id, 2), "SERVER")
            assert server.parent_id == parent
            assert server.resource["process.pid"] != os.getpid()


def test_each_emulated_structured_output_attempt_is_a_client_span(receiver, start_mock, start_proxy) -> None:
    """Structured output emulated (docs/structured-output.md): an answer asked again shows as two upstream spans, the
    first with its validation error; the usage the client got adds up both."""
    mock = start_mock("engine")
    proxy = start_proxy(mock=mock, models=["m"], environ=otel_env(receiver))
    header, trace_id, _ = traceparent()
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    got = proxy.client().chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi [mock:wrong_json]"}],
        extra_headers={"traceparent": header},
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}})
    assert json.loads(got.choices[0].message.content or "") == {"a": "Paris"}
    spans = spans_of(receiver, trace_id, 3)
    first, second = sorted((s for s in spans if s.kind == "CLIENT"), key=lambda s: s.start)
    assert first.attributes["dialect_proxy.structured.attempt"] == 1
    assert first.attributes["dialect_proxy.structured.valid"] is False
    assert "not of type 'object'" in first.attributes["dialect_proxy.structured.error"]
    assert second.attributes["dialect_proxy.structured.valid"] is True
    assert first.attributes["dialect_proxy.structured.way"] == "instruction"
    asked = [r["body"] for r in mock.requests()]
    assert [body["messages"][-1]["role"] for body in asked] == ["user", "user"]
    # The usage the client got is both answers' (the mock counts deterministically: the same bodies asked again)
    usages = [httpx.post(mock.url + "/chat", json=body).json()["usage"] for body in asked]
    assert got.usage is not None
    assert got.usage.prompt_tokens == sum(u["prompt_tokens"] for u in usages)
    assert got.usage.completion_tokens == sum(u["completion_tokens"] for u in usages)
