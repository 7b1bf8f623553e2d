"""Structured output through the proxy on every upstream (docs/structured-output.md): real clients (openai-python's
`.parse`, LangChain, pydantic-ai, the Agents SDK, the anthropic SDK) -> the proxy on loopback -> the built-in mocks
as real HTTP servers. Where the upstream cannot honour `json_schema` (MindIE, Siliconstorm, DeepSeek, the engine) the
proxy emulates it — a forced tool call, or JSON asked, checked and asked again — and never sends JSON that fails the
schema."""

from __future__ import annotations

import asyncio
import enum
import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from proxy.mock import create_app as create_mock
from tests.conftest import Mock, Proxy, ServerThread, wait_for

# model name -> (mock dialect, full_text): one upstream each, behind one proxy
UPSTREAMS: dict[str, tuple[str, bool]] = {
    "gpt-4o": ("openai", False),
    "vllm-model": ("vllm", False),
    "Qwen3-8B": ("mindie", False),
    "Qwen3-8B-full": ("mindie", True),
    "storm-model": ("siliconstorm", False),
    "deepseek-v4-flash": ("deepseek", False),
    "my-engine": ("engine", False),
}
EMULATED = ("Qwen3-8B", "Qwen3-8B-full", "storm-model", "deepseek-v4-flash", "my-engine")


class Unit(enum.StrEnum):
    celsius = "celsius"
    fahrenheit = "fahrenheit"


class Place(BaseModel):
    city: str
    country: str


class Forecast(BaseModel):
    place: Place
    unit: Unit
    days: list[int]
    note: str | None = None


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[dict[str, Mock], Proxy]]:
    from proxy.server.app import create_app
    from proxy.server.frontend import frontend_options
    from proxy.settings import build_settings

    servers: list[ServerThread] = []
    mocks: dict[str, Mock] = {}
    upstreams = []
    try:
        for model, (dialect, full_text) in UPSTREAMS.items():
            srv = ServerThread(create_mock(dialect, full_text=full_text)).start()
            servers.append(srv)
            mocks[model] = Mock(srv, dialect)
            upstreams.append({"name": f"up-{model}", "dialect": dialect, "url": srv.url, "full_text": full_text,
                              "models": [model]})
        settings = build_settings(config={"upstreams": upstreams}, environ={})
        srv = ServerThread(create_app(settings), **frontend_options(settings.server)).start()
        servers.append(srv)
        proxy = Proxy(srv, settings)
        yield mocks, proxy
        proxy.close_clients()
    finally:
        for srv in servers:
            srv.stop()


def _forecast(proxy: Proxy, model: str, stream: bool, prompt: str = "Weather in Paris?") -> Forecast:
    client = proxy.client()
    messages: Any = [{"role": "user", "content": prompt}]
    if not stream:
        got = client.chat.completions.parse(model=model, messages=messages, response_format=Forecast)
        message = got.choices[0].message
        assert message.refusal is None and got.choices[0].finish_reason == "stop" and not message.tool_calls
        assert got.usage is not None and got.usage.completion_tokens > 0
        assert message.parsed is not None
        return message.parsed
    with client.chat.completions.stream(model=model, messages=messages, response_format=Forecast) as events:
        deltas = [e.delta for e in events if e.type == "content.delta"]
        final = events.get_final_completion()
    assert deltas and final.choices[0].finish_reason == "stop"
    parsed = final.choices[0].message.parsed
    assert parsed is not None
    return parsed


def _metric(proxy: Proxy, series: str) -> float:
    for line in httpx.get(proxy.url + "/metrics").text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("model", list(UPSTREAMS))
def test_openai_parse_gives_the_model_on_every_upstream(stack, model: str, stream: bool) -> None:
    mocks, proxy = stack
    parsed = _forecast(proxy, model, stream)
    assert isinstance(parsed.place, Place) and isinstance(parsed.unit, Unit) and parsed.days
    sent = mocks[model].last_request()["body"]
    if model in EMULATED:
        assert "response_format" not in sent or sent["response_format"] == {"type": "json_object"}
        assert sent.get("stream") in (None, False)  # checked whole before anything goes out


@pytest.mark.parametrize("model", ["Qwen3-8B", "storm-model", "deepseek-v4-flash"])
def test_a_json_schema_becomes_one_forced_tool_call(stack, model: str) -> None:
    mocks, proxy = stack
    _forecast(proxy, model, False)
    sent = mocks[model].last_request()
    tools = sent["body"]["tools"]
    assert len(tools) == 1 and tools[0]["function"]["name"] == "Forecast"
    assert sent["body"]["tool_choice"] == {"type": "function", "function": {"name": "Forecast"}}
    # openai-python's strict schema fits DeepSeek's strict subset but for the optional `note`... it is required and
    # nullable there, so strict applies, on the /beta route
    if model == "deepseek-v4-flash":
        assert tools[0]["function"].get("strict") is True and sent["path"].startswith("/beta/")


def test_the_engine_is_asked_with_the_schema_in_the_prompt(stack) -> None:
    mocks, proxy = stack
    _forecast(proxy, "my-engine", False)
    body = mocks["my-engine"].last_request()["body"]
    assert "tools" not in body and "response_format" not in body
    assert body["messages"][0]["role"] == "system" and '"place"' in body["messages"][0]["content"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("model", ["Qwen3-8B", "my-engine", "deepseek-v4-flash"])
def test_a_wrong_first_answer_is_asked_again_and_usage_adds_up(stack, model: str, stream: bool) -> None:
    mocks, proxy = stack
    mock = mocks[model]
    mock.reset()
    parsed = _forecast(proxy, model, stream, "Weather in Paris? [mock:wrong_json]")
    assert isinstance(parsed, Forecast)
    asked = mock.requests()
    assert len(asked) == 2
    last = asked[-1]["body"]["messages"]
    assert "not what was asked" not in json.dumps(parsed.model_dump())
    assert any("valid" in str(m.get("content")) for m in last[-2:])  # the validation error went back
    metrics = httpx.get(proxy.url + "/metrics").text
    assert f'dialect_proxy_structured_output_total{{event="reasked",upstream="up-{model}"}}' in metrics


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("model", ["Qwen3-8B-full", "my-engine"])
def test_a_model_that_never_complies_gets_the_clear_error_never_invalid_json(stack, model: str, stream: bool) -> None:
    mocks, proxy = stack
    mock = mocks[model]
    mock.reset()
    tokens = f'dialect_proxy_tokens_total{{kind="completion",model="{model}",upstream="up-{model}"}}'
    before = _metric(proxy, tokens)
    httpx.post(mock.url + "/_mock/directives", json={"directives": "wrong_json=always"})
    try:
        with pytest.raises(openai.APIStatusError) as failed:
            _forecast(proxy, model, stream)
    finally:
        httpx.post(mock.url + "/_mock/directives", json={"directives": ""})
    assert failed.value.status_code == 502
    body = failed.value.body
    assert isinstance(body, dict) and body["code"] == "structured_output_failed"
    assert "No invalid JSON was sent" in body["message"]
    assert failed.value.response.headers["x-should-retry"] == "false"
    assert mock.stats()["requests"] == 3  # structured_attempts' default
    assert _metric(proxy, tokens) > before  # the tokens of the answers that failed are counted
    metrics = httpx.get(proxy.url + "/metrics").text
    assert f'dialect_proxy_structured_output_total{{event="failed",upstream="up-{model}"}}' in metrics
    assert f'code="structured_output_failed",route="/v1/chat/completions",upstream="up-{model}"' in metrics


@pytest.mark.parametrize("model", ["my-engine", "Qwen3-8B", "gpt-4o", "deepseek-v4-flash"])
def test_json_object_is_checked_for_being_an_object(stack, model: str) -> None:
    _, proxy = stack
    got = proxy.client().chat.completions.create(model=model, response_format={"type": "json_object"},
                                                 messages=[{"role": "user", "content": "Say hi in JSON"}])
    assert isinstance(json.loads(got.choices[0].message.content), dict)


def test_reject_and_drop_stay_available(start_mock, start_proxy) -> None:
    mock = start_mock("engine")
    proxy = start_proxy(mock=mock, response_format="reject", models=["my-engine"])
    with pytest.raises(openai.BadRequestError):
        proxy.client().chat.completions.parse(model="my-engine", messages=[{"role": "user", "content": "Hi"}],
                                              response_format=Forecast)
    assert mock.stats()["requests"] == 0


# -- the other clients -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("model", list(UPSTREAMS))
def test_langchain_with_structured_output_default_method(stack, model: str) -> None:
    from langchain_openai import ChatOpenAI

    _, proxy = stack
    llm = ChatOpenAI(model=model, base_url=proxy.url + "/v1", api_key="x", max_retries=0)
    got = llm.with_structured_output(Forecast).invoke("Weather in Paris?")
    assert isinstance(got, Forecast) and isinstance(got.unit, Unit)


# langchain-openai's stream dumps each of openai-python's parsed stream events, whose `parsed` field is typed None,
# and pydantic warns about the model it holds (langchain-ai/langchain issue 38034): the client's own warning, the
# same on the openai upstream as on the emulated ones.
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
@pytest.mark.parametrize("way", ["stream", "astream"])
@pytest.mark.parametrize("model", list(UPSTREAMS))
def test_langchain_with_structured_output_default_method_streamed(stack, model: str, way: str) -> None:
    """`.stream()` / `.astream()` of the default (`json_schema`) method: openai-python's `chat.completions.stream`
    underneath; every object it yields is a whole, valid Forecast."""
    from langchain_openai import ChatOpenAI

    mocks, proxy = stack

    async def collect() -> list[Any]:
        async with httpx.AsyncClient() as http:  # its own, closed here (the default one is shared between models)
            allm = ChatOpenAI(model=model, base_url=proxy.url + "/v1", api_key="x", max_retries=0,
                              http_async_client=http)
            return [chunk async for chunk in allm.with_structured_output(Forecast).astream("Weather in Paris?")]

    if way == "stream":
        llm = ChatOpenAI(model=model, base_url=proxy.url + "/v1", api_key="x", max_retries=0)
        chunks = list(llm.with_structured_output(Forecast).stream("Weather in Paris?"))
    else:
        chunks = asyncio.run(collect())
    assert chunks and all(isinstance(chunk, Forecast) for chunk in chunks)
    assert isinstance(chunks[-1].place, Place) and isinstance(chunks[-1].unit, Unit) and chunks[-1].days
    sent = mocks[model].last_request()["body"]
    if model not in EMULATED:  # passed on as the client streamed it
        assert sent["stream"] is True and sent["response_format"]["type"] == "json_schema"


async def _pydantic_ai(proxy: Proxy, model: str, stream: bool, output_type: Any) -> tuple[Forecast, list[Any]]:
    """The agent's output, and (streamed) every partial output `stream_output` gave before it."""
    import pydantic_ai
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)
    chat = OpenAIChatModel(model, provider=OpenAIProvider(openai_client=client))
    agent = pydantic_ai.Agent(chat, output_type=output_type)
    try:
        if not stream:
            return (await agent.run("Weather in Paris?")).output, []
        async with agent.run_stream("Weather in Paris?") as result:
            partials = [output async for output in result.stream_output(debounce_by=None)]
            return await result.get_output(), partials
    finally:
        await client.close()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("model", list(UPSTREAMS))
def test_pydantic_ai_native_output(stack, model: str, stream: bool) -> None:
    """`NativeOutput(Model)`: a `json_schema` response_format, emulated where the upstream has none."""
    from pydantic_ai.output import NativeOutput

    mocks, proxy = stack
    output, partials = asyncio.run(_pydantic_ai(proxy, model, stream, NativeOutput(Forecast)))
    assert isinstance(output, Forecast) and isinstance(output.unit, Unit)
    assert all(isinstance(partial, Forecast) for partial in partials)
    sent = mocks[model].last_request()["body"]
    assert all(tool["function"]["name"] != "final_result" for tool in sent.get("tools", []))  # no output tool
    if model not in EMULATED:
        assert sent["response_format"]["type"] == "json_schema"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("model", list(UPSTREAMS))
def test_pydantic_ai_default_output_type_calls_its_output_tool(stack, model: str, stream: bool) -> None:
    """A plain `output_type=Model` (pydantic-ai's default, `ToolOutput`): the agent offers its own `final_result`
    tool and requires a tool call; the proxy passes the tool on (no response_format to emulate) and the upstream's
    call comes back as a tool call, streamed as argument deltas when the client streams."""
    mocks, proxy = stack
    output, partials = asyncio.run(_pydantic_ai(proxy, model, stream, Forecast))
    assert isinstance(output, Forecast) and isinstance(output.place, Place) and isinstance(output.unit, Unit)
    assert all(isinstance(partial, Forecast) for partial in partials)
    if stream:
        assert partials and partials[-1] == output
    sent = mocks[model].last_request()["body"]
    assert [tool["function"]["name"] for tool in sent["tools"]] == ["final_result"]
    assert "response_format" not in sent


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_pydantic_ai_default_on_a_mindie_model_that_calls_no_tools(start_mock, start_proxy, stream: bool) -> None:
    """MindIE refuses tools to the models outside its list: the proxy emulates the agent's forced output tool — asked
    with the tool's schema, checked — and answers with the call."""
    mock = start_mock("mindie")
    proxy = start_proxy(mock=mock)
    output, partials = asyncio.run(_pydantic_ai(proxy, "Llama-3.1-8B-Instruct", stream, Forecast))
    assert isinstance(output, Forecast) and isinstance(output.unit, Unit)
    assert all(isinstance(partial, Forecast) for partial in partials)
    sent = mock.last_request()["body"]
    assert "tools" not in sent and "tool_choice" not in sent and sent.get("stream") in (None, False)
    assert sent["messages"][0]["role"] == "system" and '"place"' in sent["messages"][0]["content"]


def test_a_forced_tool_on_a_model_that_calls_no_tools_is_asked_again_until_valid(start_mock, start_proxy) -> None:
    mock = start_mock("mindie")
    proxy = start_proxy(mock=mock)
    tool: Any = {"type": "function", "function": {"name": "forecast", "parameters": Forecast.model_json_schema()}}
    got = proxy.client().chat.completions.create(
        model="Llama-3.1-8B-Instruct", tools=[tool], tool_choice={"type": "function", "function": {"name": "forecast"}},
        messages=[{"role": "user", "content": "Weather in Paris? [mock:wrong_json]"}])
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "forecast" and call.id
    assert isinstance(Forecast.model_validate_json(call.function.arguments), Forecast)
    assert mock.stats()["requests"] == 2
    # an open choice among several tools is not a forced call: MindIE's refusal, as it is
    with pytest.raises(openai.APIStatusError):
        proxy.client().chat.completions.create(
            model="Llama-3.1-8B-Instruct", tool_choice="auto",
            tools=[tool, {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}}],
            messages=[{"role": "user", "content": "Weather in Paris?"}])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_an_anthropic_forced_tool_on_a_model_that_calls_no_tools_is_a_tool_use(start_mock, start_proxy,
                                                                                stream: bool) -> None:
    """The same emulation for a Messages client (`tool_choice: {"type": "tool"}`): one `tool_use` block whose input
    is valid, `stop_reason: tool_use`."""
    import anthropic

    mock = start_mock("mindie")
    proxy = start_proxy(mock=mock)
    client = anthropic.Anthropic(base_url=proxy.url, api_key="x", max_retries=0)
    kw: Any = dict(model="Llama-3.1-8B-Instruct", max_tokens=512,
                   messages=[{"role": "user", "content": "Weather in Paris?"}],
                   tools=[{"name": "forecast", "input_schema": Forecast.model_json_schema()}],
                   tool_choice={"type": "tool", "name": "forecast"})
    if stream:
        with client.messages.stream(**kw) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**kw)
    uses = [block for block in message.content if block.type == "tool_use"]
    assert message.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "forecast"
    assert isinstance(Forecast.model_validate(uses[0].input), Forecast)
    assert "tools" not in mock.last_request()["body"]


def _forecaster(proxy: Proxy, model: str) -> tuple[Any, openai.AsyncOpenAI]:
    from agents import Agent, OpenAIResponsesModel, set_tracing_disabled

    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)
    agent = Agent(name="forecaster", instructions="Forecast.", output_type=Forecast,
                  model=OpenAIResponsesModel(model=model, openai_client=client))
    return agent, client


@pytest.mark.parametrize("model", list(UPSTREAMS))
def test_agents_sdk_output_type_over_responses(stack, model: str) -> None:
    from agents import RunConfig, Runner

    _, proxy = stack
    agent, client = _forecaster(proxy, model)

    async def run() -> Any:
        try:
            return await Runner.run(agent, "Weather in Paris?", run_config=RunConfig(tracing_disabled=True))
        finally:
            await client.close()

    assert isinstance(asyncio.run(run()).final_output, Forecast)


@pytest.mark.parametrize("model", list(UPSTREAMS))
def test_agents_sdk_output_type_streamed(stack, model: str) -> None:
    """`Runner.run_streamed`: the JSON arrives as `response.output_text.delta` events and is the final output."""
    from agents import RunConfig, Runner

    _, proxy = stack
    agent, client = _forecaster(proxy, model)

    async def run() -> tuple[Any, list[str]]:
        try:
            result = Runner.run_streamed(agent, "Weather in Paris?", run_config=RunConfig(tracing_disabled=True))
            deltas = [event.data.delta async for event in result.stream_events()
                      if event.type == "raw_response_event" and event.data.type == "response.output_text.delta"]
            return result, deltas
        finally:
            await client.close()

    result, deltas = asyncio.run(run())
    assert result.is_complete and isinstance(result.final_output, Forecast)
    assert deltas and Forecast.model_validate_json("".join(deltas)) == result.final_output


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("model", list(UPSTREAMS))
def test_anthropic_output_config_format(stack, model: str, stream: bool) -> None:
    """The anthropic SDK's own `output_config.format` (its `messages.parse(output_format=Model)` sends it)."""
    import anthropic

    _, proxy = stack
    client = anthropic.Anthropic(base_url=proxy.url, api_key="x", max_retries=0)
    messages: Any = [{"role": "user", "content": "Weather in Paris?"}]
    if not stream:
        parsed = client.messages.parse(model=model, max_tokens=512, messages=messages, output_format=Forecast)
        assert parsed.stop_reason == "end_turn" and isinstance(parsed.parsed_output, Forecast)
        return
    schema = Forecast.model_json_schema()
    with client.messages.stream(model=model, max_tokens=512, messages=messages,
                                output_config={"format": {"type": "json_schema", "schema": schema}}) as events:
        message = events.get_final_message()
    texts = [b.text for b in message.content if b.type == "text"]
    assert message.stop_reason == "end_turn" and len(texts) == 1
    jsonschema.validate(json.loads(texts[0]), schema)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("model", list(UPSTREAMS))
def test_responses_text_format(stack, model: str, stream: bool) -> None:
    """openai-python's `responses.parse(text_format=Model)` and `responses.stream(text_format=Model)`."""
    _, proxy = stack
    client = proxy.client()
    if not stream:
        got = client.responses.parse(model=model, input="Weather in Paris?", text_format=Forecast)
    else:
        with client.responses.stream(model=model, input="Weather in Paris?", text_format=Forecast) as events:
            deltas = [e for e in events if e.type == "response.output_text.delta"]
            got = events.get_final_response()
        assert deltas
    assert got.status == "completed" and isinstance(got.output_parsed, Forecast)
    assert [item.type for item in got.output if item.type != "reasoning"] == ["message"]


def _parsed_with_reasoning(client: Any, kw: dict[str, Any], stream: bool) -> tuple[Any, str]:
    """`.parse` (or `.stream`) of a chat request: the final completion and the reasoning the client received."""
    if stream:
        with client.chat.completions.stream(**kw) as events:
            reasoning = "".join(getattr(e.chunk.choices[0].delta, "reasoning_content", None) or ""
                                for e in events if e.type == "chunk" and e.chunk.choices)
            return events.get_final_completion(), reasoning
    final = client.chat.completions.parse(**kw)
    return final, getattr(final.choices[0].message, "reasoning_content", "")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_reasoning_stays_reasoning_in_a_thinking_mode(stack, stream: bool) -> None:
    """DeepSeek's thinking mode, asked for by the client, refuses a forced tool: JSON mode with the schema shown,
    checked; the reasoning arrives as reasoning and only the JSON is the content."""
    mocks, proxy = stack
    kw: dict[str, Any] = dict(model="deepseek-v4-flash", messages=[{"role": "user", "content": "Weather?"}],
                              response_format=Forecast, extra_body={"thinking": {"type": "enabled"}})
    final, reasoning = _parsed_with_reasoning(proxy.client(), kw, stream)
    assert reasoning and isinstance(final.choices[0].message.parsed, Forecast)
    sent = mocks["deepseek-v4-flash"].last_request()["body"]
    assert "tools" not in sent and sent["response_format"] == {"type": "json_object"}
    assert sent["thinking"] == {"type": "enabled"} and '"place"' in sent["messages"][0]["content"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_reasoning_before_a_forced_tool_call_stays_reasoning(stack, stream: bool) -> None:
    """MindIE with a reasoning parser: the reasoning of the forced call's answer is the client's reasoning."""
    _, proxy = stack
    kw: dict[str, Any] = dict(model="Qwen3-8B-full", response_format=Forecast,
                              messages=[{"role": "user", "content": "Weather? [mock:reasoning_field]"}])
    final, reasoning = _parsed_with_reasoning(proxy.client(), kw, stream)
    assert reasoning and "<think>" not in (final.choices[0].message.content or "")
    assert isinstance(final.choices[0].message.parsed, Forecast)


def test_a_schema_that_is_no_json_schema_is_the_clients_400(stack) -> None:
    mocks, proxy = stack
    mocks["my-engine"].reset()
    with pytest.raises(openai.BadRequestError) as refused:
        proxy.client().chat.completions.create(
            model="my-engine", messages=[{"role": "user", "content": "Hi"}],
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}})
    assert refused.value.body["param"] == "response_format.json_schema.schema"  # type: ignore[index]
    assert mocks["my-engine"].stats()["requests"] == 0


@pytest.mark.parametrize("dialect", ["responses", "messages"])
def test_never_complies_is_the_error_in_each_client_dialects_envelope(stack, dialect: str) -> None:
    mocks, proxy = stack
    mock = mocks["my-engine"]
    httpx.post(mock.url + "/_mock/directives", json={"directives": "wrong_json=always"})
    schema = Forecast.model_json_schema()
    try:
        if dialect == "responses":
            got = httpx.post(proxy.url + "/v1/responses", timeout=30, json={
                "model": "my-engine", "input": "Weather?",
                "text": {"format": {"type": "json_schema", "name": "Forecast", "schema": schema}}})
        else:
            got = httpx.post(proxy.url + "/v1/messages", timeout=30, json={
                "model": "my-engine", "max_tokens": 256, "messages": [{"role": "user", "content": "Weather?"}],
                "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    finally:
        httpx.post(mock.url + "/_mock/directives", json={"directives": ""})
    assert got.status_code == 502
    body = got.json()
    if dialect == "responses":
        assert body["error"]["code"] == "structured_output_failed"
    else:
        assert body["type"] == "error" and "No invalid JSON was sent" in body["error"]["message"]


# -- keep-alives while the attempts run (a slow upstream: `first_byte_ms` before each whole answer) -----------------

def _raw(url: str, path: str, body: dict[str, Any]) -> tuple[int, list[str]]:
    """The raw SSE lines of a streamed request (or the error body's, for an HTTP error)."""
    with httpx.stream("POST", url + path, json=body, timeout=30) as r:
        return r.status_code, [line for line in r.iter_lines() if line]


_FORMAT = {"type": "json_schema", "json_schema": {"name": "F", "schema": Forecast.model_json_schema()}}


@pytest.fixture
def slow(start_mock, start_proxy) -> tuple[Mock, Proxy]:
    mock = start_mock("mindie")
    return mock, start_proxy(mock=mock, server={"keepalive_interval": 0.1})


def test_a_slow_emulated_stream_is_kept_alive_and_still_parses(slow) -> None:
    mock, proxy = slow
    messages = [{"role": "user", "content": "Weather in Paris? [mock:first_byte_ms=500]"}]
    schema = {"name": "Forecast", "schema": Forecast.model_json_schema()}
    status, lines = _raw(proxy.url, "/v1/chat/completions", {
        "model": "Qwen3-8B", "stream": True, "messages": messages,
        "response_format": {"type": "json_schema", "json_schema": schema}})
    assert status == 200 and lines[-1] == "data: [DONE]"
    first_data = next(i for i, line in enumerate(lines) if line.startswith("data: {"))
    assert ": keep-alive" in lines[:first_data]  # the client heard from the proxy before the JSON was ready
    content = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                      for line in lines if line.startswith("data: {") and json.loads(line[6:])["choices"])
    Forecast.model_validate_json(content)
    with proxy.client().chat.completions.stream(model="Qwen3-8B", messages=messages,  # type: ignore[arg-type]
                                                response_format=Forecast) as events:
        parsed = events.get_final_completion().choices[0].message.parsed
    assert isinstance(parsed, Forecast)
    assert mock.stats()["requests"] == 2


def test_a_slow_emulated_messages_stream_pings_first(slow) -> None:
    _, proxy = slow
    status, lines = _raw(proxy.url, "/v1/messages", {
        "model": "Qwen3-8B", "max_tokens": 256, "stream": True,
        "messages": [{"role": "user", "content": "Weather? [mock:first_byte_ms=500]"}],
        "output_config": {"format": {"type": "json_schema", "schema": Forecast.model_json_schema()}}})
    assert status == 200
    events = [line[7:] for line in lines if line.startswith("event: ")]
    assert events.index("ping") < events.index("content_block_delta")
    assert events[-1] == "message_stop"


def test_a_never_complying_slow_model_gets_the_in_stream_error_after_a_keepalive(slow) -> None:
    mock, proxy = slow
    status, lines = _raw(proxy.url, "/v1/chat/completions", {
        "model": "Qwen3-8B", "stream": True,
        "messages": [{"role": "user", "content": "Weather? [mock:first_byte_ms=300,wrong_json=always]"}],
        "response_format": _FORMAT})
    assert status == 200  # the head went with the first keep-alive
    assert lines[0] == ": keep-alive" and lines[-1] != "data: [DONE]"
    error = json.loads(lines[-1][6:])["error"]
    assert error["code"] == "structured_output_failed"
    assert not any(line.startswith("data: {\"id\"") for line in lines)  # never the invalid JSON
    metrics = httpx.get(proxy.url + "/metrics").text
    assert 'dialect_proxy_truncated_streams_total{model="Qwen3-8B",reason="upstream_error"' in metrics
    assert mock.stats()["requests"] == proxy.settings.upstreams[0].structured_attempts


def test_a_fast_failure_stays_the_http_error_before_any_keepalive(start_mock, start_proxy) -> None:
    mock = start_mock("mindie")
    proxy = start_proxy(mock=mock, server={"keepalive_interval": 5})
    status, lines = _raw(proxy.url, "/v1/chat/completions", {
        "model": "Qwen3-8B", "stream": True,
        "messages": [{"role": "user", "content": "Weather? [mock:wrong_json=always]"}],
        "response_format": _FORMAT})
    assert status == 502 and json.loads(lines[0])["error"]["code"] == "structured_output_failed"


# -- MindIE calls tools only for the models its document lists ------------------------------------------------------

@pytest.mark.parametrize(("model", "tool"), [("Qwen2.5-7B-Instruct", True), ("DeepSeek-R1-Distill-Qwen-7B", True),
                                             ("chatglm3-6b", True), ("Llama-3.1-8B-Instruct", False),
                                             ("Baichuan2-13B-Chat", False)])
def test_mindie_forces_a_tool_only_for_models_that_call_tools(start_mock, start_proxy, model: str,
                                                              tool: bool) -> None:
    mock = start_mock("mindie")
    proxy = start_proxy(mock=mock)
    parsed = proxy.client().chat.completions.parse(model=model, messages=[{"role": "user", "content": "Weather?"}],
                                                   response_format=Forecast).choices[0].message.parsed
    assert isinstance(parsed, Forecast)
    body = mock.last_request()["body"]
    if tool:
        assert body["tool_choice"] == {"type": "function", "function": {"name": "Forecast"}}
    else:  # asked with the schema in the system prompt, and checked
        assert "tools" not in body and '"place"' in body["messages"][0]["content"]
        # the mock's MindIE refuses that model a tool, as the forced tool would have been refused
        refused = httpx.post(mock.url + "/v1/chat/completions", timeout=10, json={
            "model": model, "messages": [{"role": "user", "content": "Hi"}], "tools": body.get("tools") or [
                {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]})
        assert refused.status_code == 422 and "function call" in refused.json()["error"]


def test_a_client_that_leaves_during_the_attempts_stops_them(slow) -> None:
    mock, proxy = slow
    with httpx.stream("POST", proxy.url + "/v1/chat/completions", timeout=30, json={
            "model": "Qwen3-8B", "stream": True, "response_format": _FORMAT,
            "messages": [{"role": "user", "content": "Weather? [mock:first_byte_ms=5000]"}]}) as r:
        assert next(line for line in r.iter_lines() if line) == ": keep-alive"
    # the proxy closes its upstream request at once (the mock sees the client leave while it sleeps)
    assert wait_for(lambda: mock.stats()["disconnects"] == 1, timeout=3)
    assert mock.stats()["requests"] == 1


def test_a_slow_emulated_responses_stream_opens_once_and_still_parses(slow) -> None:
    _, proxy = slow
    with proxy.client().responses.stream(model="Qwen3-8B", input="Weather? [mock:first_byte_ms=400]",
                                         text_format=Forecast) as events:
        kinds = [event.type for event in events]
        parsed = events.get_final_response().output_parsed
    assert isinstance(parsed, Forecast)
    assert kinds.count("response.created") == 1 and kinds[-1] == "response.completed"
