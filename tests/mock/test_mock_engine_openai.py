"""The mock "engine" (engine-frontend-api.md) and the plain OpenAI mock."""

from __future__ import annotations

from typing import Any

import pytest
from mockutil import MockServer, chat


def data(events: list[Any]) -> list[dict[str, Any]]:
    return [e for e in events if isinstance(e, dict)]


def engine_chat(text: str = "hi", **extra: Any) -> dict[str, Any]:
    body = chat(text, **extra)
    del body["model"]
    return body


# ----------------------------------------------------------------------------------------------------- engine

def test_engine_paths_and_model_rejection(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("engine")
    assert srv.post("/v1/chat/completions", chat()).status_code == 404
    assert srv.client.get("/v1/models").status_code == 404
    for path, body in (("/chat", chat()), ("/completion", {"model": "m", "prompt": "x"})):
        resp = srv.post(path, body)
        assert resp.status_code == 400
        assert resp.json()["error"]["param"] == "model" and resp.json()["error"]["type"] == "invalid_request_error"
    resp = srv.post("/chat", engine_chat(user="u1"))
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "user"


def test_engine_chat(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("engine")
    body = srv.post("/chat", engine_chat(do_sample=True, temperature=0.7, ww=0.7, seed=3)).json()
    assert body["object"] == "chat.completion" and body["model"] == "engine"
    assert "system_fingerprint" not in body
    assert body["choices"][0]["message"]["content"] == "Hello from the mock engine upstream! 你好, 世界 🌍."
    assert set(body["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    _, events = srv.stream("/chat", engine_chat("x [mock:chunks=2]", stream=True))
    chunks = data(events)
    assert all("usage" not in c for c in chunks) and events[-1] == "[DONE]"
    assert [c["choices"][0]["delta"] for c in chunks] == [{"role": "assistant", "content": ""},
                                                          {"content": "tok0"}, {"content": " tok1"}, {}]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1
    _, events = srv.stream("/chat", engine_chat("x [mock:chunks=2]", stream=True,
                                                stream_options={"include_usage": True}))
    chunks = data(events)
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize(("extra", "param"), [
    ({"do_sample": "yes"}, "do_sample"), ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"temperature": 3}, "temperature"), ({"ww": -1}, "ww"), ({"max_tokens": 0}, "max_tokens"),
    ({"top_logprobs": 25}, "top_logprobs"), ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
])
def test_engine_chat_validation(mock_servers: Any, extra: dict[str, Any], param: str) -> None:
    srv: MockServer = mock_servers("engine")
    resp = srv.post("/chat", engine_chat(**extra))
    assert resp.status_code == 400 and resp.json()["error"]["param"] == param


def test_engine_completion(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("engine")
    body = srv.post("/completion", {"prompt": "x [mock:chunks=40]"}).json()
    assert body["object"] == "text_completion"
    assert body["usage"]["completion_tokens"] == 16 and body["choices"][0]["finish_reason"] == "length"
    body = srv.post("/completion", {"prompt": "x [mock:chunks=3]", "max_tokens": 100}).json()
    assert body["choices"][0]["text"] == "tok0 tok1 tok2" and body["choices"][0]["finish_reason"] == "stop"
    _, events = srv.stream("/completion", {"prompt": "x [mock:chunks=3]", "stream": True})
    chunks = data(events)
    assert all(c["object"] == "text_completion" and set(c) == set(body) - {"usage"} for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == "tok0 tok1 tok2"
    resp = srv.post("/completion", {"prompt": "x", "best_of": 2, "stream": True})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "best_of"
    resp = srv.post("/completion", {"prompt": "x", "logprobs": 6})
    assert resp.status_code == 400


def test_engine_errors_and_tools(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("engine")
    resp = srv.post("/chat", engine_chat("x [mock:error=503]"))
    assert resp.status_code == 503 and "message" in resp.json()["error"]
    tools = [{"type": "function", "function": {"name": "lookup"}}]
    body = srv.post("/chat", engine_chat("x [mock:tool_calls]", tools=tools)).json()
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert body["choices"][0]["message"]["content"] is None


# ----------------------------------------------------------------------------------------------------- openai

def test_openai_stream_with_usage(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("openai")
    _, events = srv.stream("/v1/chat/completions", chat("x [mock:chunks=2]", stream=True,
                                                        stream_options={"include_usage": True}))
    chunks = data(events)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0
    assert chunks[-2]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    _, events = srv.stream("/v1/chat/completions", chat("x", stream=True))
    assert all("usage" not in c for c in data(events))


def test_openai_extra_fields(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("openai")
    vendor = {"a": 1}
    body = srv.post("/v1/chat/completions", chat("x [mock:extra_fields]")).json()
    assert body["x_vendor"] == vendor and body["usage"]["x_vendor"] == vendor
    assert body["choices"][0]["x_vendor"] == vendor and body["choices"][0]["message"]["x_vendor"] == vendor
    _, events = srv.stream("/v1/chat/completions", chat("x [mock:extra_fields]", stream=True,
                                                        stream_options={"include_usage": True}))
    for chunk in data(events):
        assert chunk["x_vendor"] == vendor
        for choice in chunk["choices"]:
            assert choice["x_vendor"] == vendor and choice["delta"]["x_vendor"] == vendor
    assert data(events)[-1]["usage"]["x_vendor"] == vendor


def test_openai_completions_and_tools(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("openai")
    body = srv.post("/v1/completions", {"model": "m", "prompt": "x [mock:chunks=2]"}).json()
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == "tok0 tok1"
    _, events = srv.stream("/v1/completions", {"model": "m", "prompt": "x [mock:chunks=2]", "stream": True,
                                               "stream_options": {"include_usage": True}})
    assert data(events)[-1]["choices"] == [] and data(events)[-1]["usage"]["completion_tokens"] == 2
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    _, events = srv.stream("/v1/chat/completions", chat("x [mock:tool_calls]", stream=True, tools=tools))
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in data(events)
             if c["choices"] and "tool_calls" in c["choices"][0]["delta"]]
    assert calls[0]["index"] == 0 and calls[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert all(set(c) == {"index", "function"} for c in calls[1:])
    body = srv.post("/v1/chat/completions", chat("x [mock:reasoning_field]")).json()
    assert body["choices"][0]["message"]["reasoning_content"]


def test_openai_errors(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("openai", api_key="sk-o", served_model="gpt-x")
    assert srv.post("/v1/chat/completions", chat(model="gpt-x")).status_code == 401
    auth = {"Authorization": "Bearer sk-o"}
    resp = srv.post("/v1/chat/completions", chat(model="other"), headers=auth)
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"
    resp = srv.post("/v1/chat/completions", chat("x [mock:error=429]", model="gpt-x"), headers=auth)
    assert resp.status_code == 429 and resp.json()["error"]["code"] == "rate_limit_exceeded"
    resp = srv.post("/v1/chat/completions", chat(model="gpt-x", stream_options={"include_usage": True}),
                    headers=auth)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "stream_options"
    assert srv.post("/v1/chat/completions", chat(model="gpt-x"), headers=auth).status_code == 200
