"""End to end: the official openai SDK -> proxy -> built-in mock "engine" upstream (POST /chat, /completion).

The mock follows the engine's document strictly (docs/upstreams.md "The engine API"): it refuses `model`, `user`
and `response_format`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import Mock, ServerThread
from tests.test_e2e_deepseek import TOOLS, collect, one_client_start_proxy  # noqa: F401  (fixture)

MSG = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def _engine_mock() -> Iterator[Mock]:
    from proxy.mock import create_app

    srv = ServerThread(create_app("engine")).start()
    try:
        yield Mock(srv, "engine")
    finally:
        srv.stop()


@pytest.fixture
def engine(_engine_mock: Mock, start_proxy):
    mock = _engine_mock
    mock.reset()
    proxy = start_proxy([{"name": "npu-engine", "dialect": "engine", "url": mock.url, "models": ["my-engine"]}])
    return mock, proxy


@pytest.mark.parametrize("stream", [False, True])
def test_chat_goes_to_post_chat_without_model_and_is_filled_to_openai(engine, stream) -> None:
    mock, proxy = engine
    got = proxy.client().chat.completions.create(model="my-engine", messages=MSG, stream=stream, temperature=0,
                                                 user="end-user-1", seed=7, response_format={"type": "text"})
    if stream:
        acc = collect(got)
        chunks = acc["chunks"]
        assert acc["content"].startswith("Hello from the mock engine upstream!") and acc["finish"] == ["stop"]
        assert acc["roles"] == ["assistant"]
        assert {c.model for c in chunks} == {"my-engine"} and len({c.id for c in chunks}) == 1
        assert all(c.object == "chat.completion.chunk" and c.id.startswith("chatcmpl-") for c in chunks)
    else:
        assert got.choices[0].message.content.startswith("Hello from the mock engine upstream!")
        assert got.model == "my-engine" and got.object == "chat.completion" and got.id.startswith("chatcmpl-")
        assert got.created > 0 and got.usage.total_tokens > 0
    last = mock.last_request()
    assert last["path"] == "/chat"
    body = last["body"]
    for dropped in ("model", "user", "seed", "response_format"):
        assert dropped not in body
    assert body["do_sample"] is False and body["temperature"] == 0


@pytest.mark.parametrize("fmt", [{"type": "json_object"}, {"type": "json_schema", "json_schema": {
    "name": "answer", "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}}])
@pytest.mark.parametrize("stream", [False, True])
def test_response_format_is_a_400_naming_it_when_rejecting_and_left_out_when_dropping(engine, start_proxy, fmt,
                                                                                      stream) -> None:
    """The engine cannot honour JSON mode: by default it is emulated (tests/test_e2e_structured.py); with
    `response_format: reject` the client gets a 400 naming `response_format`, before the engine is asked, not prose
    where it expects JSON. `response_format: drop` on the upstream opts into leaving it out."""
    mock, _ = engine
    proxy = start_proxy([{"name": "npu-engine", "dialect": "engine", "url": mock.url, "models": ["my-engine"],
                          "response_format": "reject"}])
    with pytest.raises(openai.BadRequestError) as refused:
        proxy.client().chat.completions.create(model="my-engine", messages=MSG, response_format=fmt, stream=stream)
    error = refused.value.body
    assert isinstance(error, dict) and error["param"] == "response_format"
    assert error["type"] == "invalid_request_error" and "response_format: drop" in error["message"]
    assert refused.value.response.headers["x-should-retry"] == "false"
    assert mock.stats()["requests"] == 0
    dropping = start_proxy([{"name": "npu-engine", "dialect": "engine", "url": mock.url, "models": ["my-engine"],
                             "response_format": "drop"}])
    got = dropping.client().chat.completions.create(model="my-engine", messages=MSG, response_format=fmt)
    assert got.choices[0].message.content.startswith("Hello from the mock engine upstream!")
    assert "response_format" not in mock.last_request()["body"]


def test_do_sample_is_true_unless_temperature_is_zero(engine) -> None:
    mock, proxy = engine
    proxy.client().chat.completions.create(model="my-engine", messages=MSG)
    assert mock.last_request()["body"]["do_sample"] is True
    proxy.client().chat.completions.create(model="my-engine", messages=MSG, temperature=0.7)
    assert mock.last_request()["body"]["do_sample"] is True


@pytest.mark.parametrize("stream", [False, True])
def test_completions_go_to_post_completion(engine, stream) -> None:
    mock, proxy = engine
    got = proxy.client().completions.create(model="my-engine", prompt="Once upon a time", max_tokens=5,
                                            stream=stream, user="u", seed=1)
    if stream:
        chunks = list(got)
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        assert {c.model for c in chunks} == {"my-engine"} and all(c.id.startswith("cmpl-") for c in chunks)
        assert chunks[-1].choices[0].finish_reason == "length"
    else:
        text = got.choices[0].text
        assert got.model == "my-engine" and got.id.startswith("cmpl-") and got.object == "text_completion"
        assert got.choices[0].finish_reason == "length" and got.usage.completion_tokens == 5
    assert text.startswith("Hello from the mock engine")
    last = mock.last_request()
    assert last["path"] == "/completion" and "model" not in last["body"] and "user" not in last["body"]
    assert last["body"]["do_sample"] is True


def test_stream_usage_per_include_usage(engine) -> None:
    mock, proxy = engine
    acc = collect(proxy.client().chat.completions.create(model="my-engine", messages=MSG, stream=True,
                                                         stream_options={"include_usage": True}))
    chunks = acc["chunks"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 13
    assert all(c.usage is None for c in chunks[:-1])
    raw = httpx.post(proxy.base_url + "/chat/completions", timeout=30,
                     json={"model": "my-engine", "messages": MSG, "stream": True})
    assert '"usage"' not in raw.text and raw.text.rstrip().endswith("data: [DONE]")
    raw = httpx.post(proxy.base_url + "/completions", timeout=30,
                     json={"model": "my-engine", "prompt": "x", "stream": True,
                           "stream_options": {"include_usage": True}})
    assert raw.text.count('"usage":{') == 1


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls(engine, stream) -> None:
    mock, proxy = engine
    messages = [{"role": "user", "content": "Weather in Paris? [mock:tool_calls=2]"}]
    if stream:
        with proxy.client().chat.completions.stream(model="my-engine", messages=messages, tools=TOOLS) as s:
            for _ in s:
                pass
            final = s.get_final_completion()
    else:
        final = proxy.client().chat.completions.create(model="my-engine", messages=messages, tools=TOOLS)
    calls = final.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "get_weather"]
    assert all(c.function.arguments == '{"city": "Paris", "unit": "celsius"}' and c.id for c in calls)
    assert final.choices[0].finish_reason == "tool_calls"
    # The tool result goes back as the document's tool message.
    history: list[Any] = [*messages, final.choices[0].message,
                          *({"role": "tool", "tool_call_id": c.id, "content": "sunny"} for c in calls)]
    assert proxy.client().chat.completions.create(model="my-engine", messages=history, tools=TOOLS).choices


def test_limits_and_unsupported_extras_are_clear_400s(engine) -> None:
    mock, proxy = engine
    client = proxy.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="my-engine", messages=MSG, stop=["a", "b", "c", "d", "e"])
    assert e.value.body["param"] == "stop"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="my-engine", messages=[
            *MSG, {"role": "assistant", "content": "Once", "prefix": True}])
    assert e.value.body["param"] == "messages[1].prefix" and "prefix" in e.value.message
    assert mock.stats()["requests"] == 0


def test_upstream_errors_pass_through(engine) -> None:
    mock, proxy = engine
    with pytest.raises(openai.RateLimitError) as e:
        proxy.client().chat.completions.create(model="my-engine",
                                               messages=[{"role": "user", "content": "x [mock:error=429]"}])
    assert e.value.response.headers["retry-after"] == "7"
