"""End to end: the official openai SDK -> proxy -> built-in mock Siliconstorm (hosted MindIE, `{"code": N}` errors)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from proxy.server.app import create_app
from proxy.settings import build_settings
from tests.conftest import Mock, Proxy, ServerThread

ANSWER = "Hello from the mock siliconstorm upstream! 你好, 世界 🌍."
KEY = "sk-siliconstorm-test"


@pytest.fixture(scope="module")
def env() -> Iterator[tuple[Mock, Proxy, Proxy]]:
    """(mock with an API key, proxy with the right key, proxy with a wrong key)."""
    from proxy.mock import create_app as create_mock

    started = [ServerThread(create_mock("siliconstorm", full_text=True, api_key=KEY)).start()]
    mock = Mock(started[0], "siliconstorm")
    proxies = []
    for key in (KEY, "sk-wrong"):
        up = {"name": "ss", "dialect": "siliconstorm", "url": mock.url + "/v1", "full_text": True,
              "api_key_env": "SS_KEY"}
        settings = build_settings(config={"upstreams": [up]}, environ={"SS_KEY": key})
        started.append(ServerThread(create_app(settings)).start())
        proxies.append(Proxy(started[-1], settings))
    yield mock, proxies[0], proxies[1]
    for proxy in proxies:
        proxy.close()
    for srv in reversed(started):
        srv.stop()


def say(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def test_answers_stream_and_not(env: tuple[Mock, Proxy, Proxy]) -> None:
    mock, proxy, _ = env
    client = proxy.client()
    got = client.chat.completions.create(model="DeepSeek-R1", messages=say("hi [mock:think_close_only]"))
    assert got.choices[0].message.content == ANSWER and got.id.startswith("chatcmpl-")
    assert got.choices[0].message.model_extra["reasoning_content"].startswith("The user greets me")
    raw = httpx.post(proxy.base_url + "/chat/completions", timeout=30,
                     json={"model": "Qwen3-32B", "messages": say("hi")}).json()
    assert "tool_calls" not in raw["choices"][0]["message"]  # Siliconstorm's `tool_calls: null` is dropped
    assert "prefill_time" not in raw and "decode_time_arr" not in raw
    chunks = list(client.chat.completions.create(model="Qwen3", messages=say("hi [mock:think]"), stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                        for c in chunks if c.choices)
    assert text == ANSWER and reasoning.startswith("The user greets me")  # cumulative -> deltas, tags split
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0
    assert mock.last_request()["headers"]["authorization"] == f"Bearer {KEY}"


def test_tool_calls_accumulate_in_the_stream_helper(env: tuple[Mock, Proxy, Proxy]) -> None:
    _, proxy, _ = env
    tools = [{"type": "function", "function": {"name": "get_delivery_date", "parameters": {"type": "object"}}}]
    with proxy.client().chat.completions.stream(model="qwen", messages=say("hi [mock:tool_calls=2]"),
                                                tools=tools) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_delivery_date"] * 2
    assert all(json.loads(c.function.arguments) == {"city": "Paris", "unit": "celsius"} for c in calls)


CODES = [
    (701, openai.APIStatusError, 402, "insufficient_quota", "insufficient_quota", "Insufficient balance"),
    (702, openai.PermissionDeniedError, 403, "permission_error", "permission_denied", "Authorization not passed"),
    (801, openai.AuthenticationError, 401, "authentication_error", "invalid_api_key", "Apikey error"),
    (802, openai.InternalServerError, 504, "timeout_error", "upstream_timeout", "Request timeout"),
    (9999, openai.InternalServerError, 502, "upstream_error", "bad_gateway", "Model response exception"),
]


@pytest.mark.parametrize("http_status", [200, 500])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("code", "exc", "status", "type_", "err_code", "message"), CODES)
def test_error_codes_become_openai_errors(env: tuple[Mock, Proxy, Proxy], http_status: int, stream: bool,
                                          code: int, exc: type[Exception], status: int, type_: str, err_code: str,
                                          message: str) -> None:
    _, proxy, _ = env
    directive = f"[mock:code={code},status={http_status}]"
    with pytest.raises(exc) as e:
        proxy.client().chat.completions.create(model="DeepSeek-R1", messages=say(directive), stream=stream)
    err = e.value
    assert isinstance(err, openai.APIStatusError)
    assert err.status_code == status  # never a 200 stream that then fails, never 429 (the SDK would retry)
    assert (err.body["type"], err.body["code"]) == (type_, err_code)
    assert err.body["message"].startswith(message) and str(code) in err.body["message"]
    assert err.response.headers.get("x-should-retry") == ("false" if status < 500 else None)


def test_insufficient_balance_is_not_retried_by_the_sdk(env: tuple[Mock, Proxy, Proxy]) -> None:
    mock, proxy, _ = env
    mock.reset()
    with pytest.raises(openai.APIStatusError) as e:
        proxy.client(max_retries=3).chat.completions.create(model="m", messages=say("[mock:code=701]"))
    assert e.value.status_code == 402
    assert mock.stats()["requests"] == 1


@pytest.mark.parametrize("stream", [False, True])
def test_wrong_api_key_is_401(env: tuple[Mock, Proxy, Proxy], stream: bool) -> None:
    _, _, wrong = env
    with pytest.raises(openai.AuthenticationError) as e:
        wrong.client().chat.completions.create(model="DeepSeek-R1", messages=say("hi"), stream=stream)
    assert e.value.body["code"] == "invalid_api_key" and "Apikey error" in e.value.body["message"]
    assert "sk-wrong" not in e.value.response.text


def test_mindie_shaped_errors_from_the_engine_behind(env: tuple[Mock, Proxy, Proxy]) -> None:
    _, proxy, _ = env
    with pytest.raises(openai.BadRequestError) as e:
        proxy.client().chat.completions.create(model="m", messages=say("[mock:error=422]"))
    assert e.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.InternalServerError) as e5:
        proxy.client().chat.completions.create(model="m", messages=say("[mock:error=503]"), stream=True)
    assert e5.value.status_code == 503
    # Siliconstorm takes top_k 0 (MindIE proper does not), and top_p 0 is clamped into its range.
    got = proxy.client().chat.completions.create(model="m", messages=say("hi"), top_p=0,
                                                 extra_body={"top_k": 0})
    assert got.choices[0].message.content


@pytest.mark.parametrize(("code", "exc", "status", "type_", "err_code", "message"), CODES)
def test_error_code_as_the_first_stream_event_is_an_http_error(
        env: tuple[Mock, Proxy, Proxy], code: int, exc: type[Exception], status: int, type_: str, err_code: str,
        message: str) -> None:
    # A 200 event stream whose first event is {"code": N, ...}: nothing has reached the client yet, so it gets the
    # HTTP status and envelope, not a 200 stream that then fails.
    _, proxy, _ = env
    with pytest.raises(exc) as e:
        proxy.client().chat.completions.create(
            model="DeepSeek-R1", messages=say(f"[mock:code_in_stream={code}]"), stream=True)
    assert isinstance(e.value, openai.APIStatusError)
    assert e.value.status_code == status and e.value.body["code"] == err_code
    assert e.value.body["message"].startswith(message)
