"""The proxy's traces in a real trace viewer: Arize Phoenix (`phoenix serve`, on loopback, its telemetry off) as the
OTLP receiver, the spans read back through Phoenix's REST API (GET /v1/projects/{project}/spans). Heavy (Phoenix
takes a while to start and lives in its own virtualenv): `make test-otel` installs it into .venv-phoenix and runs
these (marker `phoenix`, left out of `make test`).

The agent turn (a Responses tool call, the tool's run, the answer) is traced the way an instrumented agent would
trace it: the test's own OpenTelemetry SDK exports an `invoke_agent` root span and an `execute_tool` span to Phoenix,
and the proxy's spans join that trace through the traceparent each call carries. With DIALECT_PROXY_SCREENSHOT=PATH,
headless Chromium photographs that trace in Phoenix's trace view (docs/img/phoenix-agent-turn.png)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.conftest import free_port, wait_for

pytestmark = pytest.mark.phoenix

ROOT = Path(__file__).resolve().parent.parent
PHOENIX = os.environ.get("PHOENIX_BIN", str(ROOT / ".venv-phoenix" / "bin" / "phoenix"))
TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


class Phoenix:
    def __init__(self, url: str) -> None:
        self.url = url

    def spans(self, trace_id: str) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.url}/v1/projects/default/spans", params={"trace_id": trace_id, "limit": 100},
                      timeout=10)
        r.raise_for_status()
        data: list[dict[str, Any]] = r.json()["data"]
        return data

    def wait(self, trace_id: str, count: int) -> list[dict[str, Any]]:
        assert wait_for(lambda: len(self.spans(trace_id)) >= count, timeout=30, interval=0.25), \
            self.spans(trace_id)
        return self.spans(trace_id)


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    if not os.path.exists(PHOENIX):
        pytest.skip(f"Phoenix is not installed at {PHOENIX} (`make test-otel` installs it into .venv-phoenix)")
    work = tmp_path_factory.mktemp("phoenix")
    port, grpc_port = free_port(), free_port()
    env = {**os.environ, "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(port), "PHOENIX_GRPC_PORT": str(grpc_port),
           "PHOENIX_WORKING_DIR": str(work), "PHOENIX_TELEMETRY_ENABLED": "false"}
    with open(work / "phoenix.log", "wb") as log:
        proc = subprocess.Popen([PHOENIX, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            try:
                return httpx.get(url + "/v1/projects", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        if not wait_for(up, timeout=180, interval=0.5):
            raise RuntimeError(f"Phoenix did not start: {(work / 'phoenix.log').read_text()[-2000:]}")
        yield Phoenix(url)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def otel_env(phoenix: Phoenix, **extra: str) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": phoenix.url, "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_METRICS_EXPORTER": "none",  # Phoenix takes traces only
            **extra}


def context() -> tuple[str, str, str]:
    trace_id, span_id = os.urandom(16).hex(), os.urandom(8).hex()
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def by_kind(spans: list[dict[str, Any]], parent: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The proxy's server span under `parent`, and its client spans (in start order)."""
    servers = [s for s in spans if s["parent_id"] == parent and s["attributes"].get("http.route")]
    assert len(servers) == 1, spans
    server = servers[0]
    clients = sorted((s for s in spans if s["parent_id"] == server["context"]["span_id"]),
                     key=lambda s: s["start_time"])
    assert clients, spans
    return server, clients


def check_tokens(span: dict[str, Any], input_tokens: int, output_tokens: int) -> None:
    assert span["attributes"]["gen_ai.usage.input_tokens"] == input_tokens
    assert span["attributes"]["gen_ai.usage.output_tokens"] == output_tokens


def test_chat_streamed_and_not(phoenix: Phoenix, start_mock, start_proxy) -> None:
    mock = start_mock("mindie", full_text=True)
    proxy = start_proxy(mock=mock, full_text=True, environ=otel_env(phoenix))
    client = proxy.client()
    header, trace_id, parent = context()
    answer = client.chat.completions.create(model="qwen", messages=[{"role": "user", "content": "hi"}],
                                            temperature=0.2, extra_headers={"traceparent": header})
    assert answer.usage is not None
    server, clients = by_kind(phoenix.wait(trace_id, 2), parent)
    assert server["name"] == "chat qwen" and server["context"]["trace_id"] == trace_id
    assert server["attributes"]["gen_ai.response.id"] == answer.id
    assert server["attributes"]["gen_ai.request.temperature"] == 0.2
    assert clients[0]["attributes"]["gen_ai.provider.name"] == "mindie"
    assert mock.last_request()["traceparent"] == f"00-{trace_id}-{clients[0]['context']['span_id']}-01"
    for span in (server, clients[0]):
        check_tokens(span, answer.usage.prompt_tokens, answer.usage.completion_tokens)
        assert span["attributes"]["gen_ai.response.finish_reasons"] == ["stop"]

    header, trace_id, parent = context()
    usage = None
    for chunk in client.chat.completions.create(model="qwen", messages=[{"role": "user", "content": "hi"}],
                                                stream=True, stream_options={"include_usage": True},
                                                extra_headers={"traceparent": header}):
        usage = chunk.usage or usage
    assert usage is not None
    server, clients = by_kind(phoenix.wait(trace_id, 2), parent)
    assert server["attributes"]["gen_ai.request.stream"] is True
    for span in (server, clients[0]):
        check_tokens(span, usage.prompt_tokens, usage.completion_tokens)
        assert span["attributes"]["gen_ai.response.time_to_first_chunk"] > 0


def test_messages_call(phoenix: Phoenix, start_mock, start_proxy) -> None:
    mock = start_mock("deepseek")
    proxy = start_proxy(mock=mock, environ=otel_env(phoenix))
    header, trace_id, parent = context()
    with anthropic.Anthropic(base_url=proxy.url, api_key="sk-client-key", max_retries=0) as client:
        message = client.messages.create(model="claude-x", max_tokens=64, messages=[{"role": "user", "content": "hi"}],
                                         extra_headers={"traceparent": header})
    server, clients = by_kind(phoenix.wait(trace_id, 2), parent)
    assert server["attributes"]["http.route"] == "/v1/messages"
    assert server["attributes"]["gen_ai.response.id"] == message.id
    assert clients[0]["attributes"]["gen_ai.provider.name"] == "deepseek"
    for span in (server, clients[0]):
        check_tokens(span, message.usage.input_tokens, message.usage.output_tokens)


def test_upstream_error(phoenix: Phoenix, start_mock, start_proxy) -> None:
    mock = start_mock("openai")
    proxy = start_proxy(mock=mock, environ=otel_env(phoenix))
    header, trace_id, parent = context()
    with pytest.raises(openai.InternalServerError):
        proxy.client().chat.completions.create(model="m", messages=[
            {"role": "user", "content": "hi [mock:error=500]"}], extra_headers={"traceparent": header})
    server, clients = by_kind(phoenix.wait(trace_id, 2), parent)
    assert server["status_code"] == "ERROR" and clients[0]["status_code"] == "ERROR"
    assert server["attributes"]["error.type"] == clients[0]["attributes"]["error.type"] == "bad_gateway"
    assert clients[0]["attributes"]["http.response.status_code"] == 500


def test_agent_turn_with_a_retry_on_a_second_replica(phoenix: Phoenix, start_mock, start_proxy) -> None:
    """A Responses tool turn as an agent runs it, its first call failing over from a busy replica."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    busy = start_mock("openai", directives="error=503")
    good = start_mock("openai")
    proxy = start_proxy([{"name": "gpu-pool", "dialect": "openai", "url": [busy.url, good.url],
                          "outlier_failures": 0, "health_interval": 0}],
                        environ=otel_env(phoenix, OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true",
                                         OTEL_SERVICE_NAME="dialect-proxy"))
    provider = TracerProvider(resource=Resource.create({"service.name": "weather-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=phoenix.url + "/v1/traces")))
    tracer = provider.get_tracer("weather-agent")
    client = proxy.client()
    try:
        # least_outstanding breaks ties at random: until the busy replica was asked first on the turn's FIRST call (the
        # one whose attempts are checked below; busy asked on the second call only does not count)
        asked_first = False
        for _ in range(20):
            before = busy.stats()["requests"]
            with tracer.start_as_current_span("invoke_agent weather-agent", kind=trace.SpanKind.INTERNAL,
                                              attributes={"gen_ai.operation.name": "invoke_agent",
                                                          "gen_ai.agent.name": "weather-agent"}) as root:
                carrier: dict[str, str] = {}
                TraceContextTextMapPropagator().inject(carrier)
                first = client.responses.create(model="gpt-agent", tools=TOOLS,  # type: ignore[arg-type]
                                                input="What is the weather in Paris? [mock:call_tool]",
                                                extra_headers=carrier)
                asked_first = busy.stats()["requests"] > before
                call = next(item for item in first.output if item.type == "function_call")
                with tracer.start_as_current_span("execute_tool get_weather",
                                                  attributes={"gen_ai.operation.name": "execute_tool",
                                                              "gen_ai.tool.name": call.name}):
                    result = json.dumps({"city": "Paris", "sky": "clear", "celsius": 21})
                carrier = {}
                TraceContextTextMapPropagator().inject(carrier)
                second = client.responses.create(
                    model="gpt-agent", tools=TOOLS, extra_headers=carrier,  # type: ignore[arg-type]
                    input=[{"role": "user", "content": "What is the weather in Paris? [mock:call_tool]"},
                           {"type": "function_call", "call_id": call.call_id, "name": call.name,
                            "arguments": call.arguments},
                           {"type": "function_call_output", "call_id": call.call_id, "output": result}])
                trace_id = format(root.get_span_context().trace_id, "032x")
                root_id = format(root.get_span_context().span_id, "016x")
            if asked_first:
                break
    finally:
        provider.shutdown()
    assert asked_first and "clear" in second.output_text
    spans = phoenix.wait(trace_id, 2 + 2 + 3)  # agent, tool; server + client for the answer; server + 2 clients
    servers = sorted((s for s in spans if s["attributes"].get("http.route") == "/v1/responses"),
                     key=lambda s: s["start_time"])
    assert len(servers) == 2 and all(s["parent_id"] == root_id for s in servers)
    for server, response in zip(servers, (first, second), strict=True):
        assert server["name"] == "chat gpt-agent"
        assert server["attributes"]["gen_ai.response.id"] == response.id
        assert response.usage is not None
        check_tokens(server, response.usage.input_tokens, response.usage.output_tokens)
    assert servers[0]["attributes"]["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert "get_weather" in servers[0]["attributes"]["gen_ai.output.messages"]
    attempts = sorted((s for s in spans if s["parent_id"] == servers[0]["context"]["span_id"]),
                      key=lambda s: s["start_time"])
    assert [a["attributes"]["server.port"] for a in attempts] == [busy.srv.port, good.srv.port]
    assert attempts[0]["attributes"]["error.type"] == "503" and attempts[0]["status_code"] == "ERROR"
    assert attempts[1]["status_code"] != "ERROR"
    check_tokens(attempts[1], first.usage.input_tokens, first.usage.output_tokens)  # type: ignore[union-attr]
    assert good.last_request()["traceparent"].split("-")[1] == trace_id

    shot = os.environ.get("DIALECT_PROXY_SCREENSHOT")
    if shot:
        screenshot(phoenix, trace_id, servers[0]["id"], Path(shot))


def screenshot(phoenix: Phoenix, trace_id: str, span: str, path: Path) -> None:
    """Phoenix's trace view of `trace_id` with the span whose Phoenix id is `span` open, photographed by headless
    Chromium (Debian package chromium)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "headless Chromium is needed for the screenshot (apt-get install chromium)"
    project = httpx.get(phoenix.url + "/v1/projects", timeout=10).json()["data"]
    project_id = next(p["id"] for p in project if p["name"] == "default")
    url = f"{phoenix.url}/projects/{project_id}/traces/{trace_id}?selectedSpanNodeId={span}"
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--virtual-time-budget=15000", "--window-size=1600,1000", f"--screenshot={path}", url],
                   check=True, timeout=120, capture_output=True)
    assert path.stat().st_size > 10_000
