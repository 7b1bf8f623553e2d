"""End to end: the official openai SDK -> proxy (uvicorn, loopback) -> built-in mock MindIE (uvicorn).

Every bullet of the MindIE issue, from the client's side. Servers are shared per module (one per configuration).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from proxy.__main__ import parser, settings_from_args
from proxy.server.app import create_app
from proxy.settings import build_settings
from tests.conftest import Mock, Proxy, ServerThread

MINDIE_ONLY = ("full_text", "prefill_time", "decode_time_arr", "batch_size", "queue_wait_time")
ANSWER = "Hello from the mock mindie upstream! 你好, 世界 🌍."
REASONING = "The user greets me; 先想一想 🤔 then answer politely."
CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": CITY}}]

Stack = Callable[..., tuple[Mock, Proxy]]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """stack(full_text=False, mock_kw={...}, client={...}, **upstream_settings) -> (mock, proxy), cached."""
    started: list[ServerThread] = []
    mocks: dict[str, Mock] = {}
    proxies: dict[str, tuple[Mock, Proxy]] = {}

    def get(full_text: bool = False, mock_kw: dict[str, Any] | None = None, client: dict[str, Any] | None = None,
            dialect: str = "mindie", **upstream: Any) -> tuple[Mock, Proxy]:
        from proxy.mock import create_app as create_mock

        mkey = json.dumps([dialect, full_text, mock_kw], sort_keys=True)
        if mkey not in mocks:
            srv = ServerThread(create_mock(dialect, full_text=full_text, **(mock_kw or {}))).start()
            started.append(srv)
            mocks[mkey] = Mock(srv, dialect)
        mock = mocks[mkey]
        pkey = json.dumps([mkey, client, upstream], sort_keys=True)
        if pkey not in proxies:
            up = {"name": "mi", "dialect": dialect, "url": mock.url, "full_text": full_text, **upstream}
            settings = build_settings(config={"upstreams": [up], "client": client or {}}, environ={})
            srv = ServerThread(create_app(settings)).start()
            started.append(srv)
            proxies[pkey] = (mock, Proxy(srv, settings))
        return proxies[pkey]

    yield get
    for _, proxy in proxies.values():
        proxy.close()
    for srv in reversed(started):
        srv.stop()


def say(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def stream_deltas(proxy: Proxy, model: str, text: str, **kw: Any) -> list[Any]:
    return list(proxy.client().chat.completions.create(model=model, messages=say(text), stream=True, **kw))


def joined(chunks: list[Any], field: str = "content") -> str:
    return "".join(getattr(c.choices[0].delta, field, None) or "" for c in chunks if c.choices)


def raw_stream(proxy: Proxy, body: dict[str, Any]) -> str:
    r = httpx.post(proxy.base_url + "/chat/completions", json={"stream": True, **body}, timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    return r.text


# ======================================================================================== cumulative -> deltas

@pytest.mark.parametrize("directive", ["", "[mock:split_utf8]"])
def test_full_text_stream_becomes_true_deltas(stack: Stack, directive: str) -> None:
    _, proxy = stack(full_text=True)
    chunks = stream_deltas(proxy, "qwen", "hi " + directive)
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(deltas) == ANSWER  # concatenated deltas are exactly the final text
    # One per token; repeated snapshots emit nothing. A snapshot ending in a half-decoded character sends what
    # precedes it (" ") and holds the U+FFFD back until the next snapshot resolves it ("🌍").
    assert len(deltas) == (13 if directive else 12)
    assert not any("\ufffd" in d for d in deltas)
    assert deltas[:3] == ["Hello", " from", " the"]
    raw = raw_stream(proxy, {"model": "qwen", "messages": say("hi " + directive)})
    assert "full_text" not in raw and raw.count('"role"') == 1


def test_full_text_generation_cut_mid_character_ends_with_the_replacement_character(stack: Stack) -> None:
    _, proxy = stack(full_text=True)
    chunks = stream_deltas(proxy, "qwen", "hi [mock:split_utf8_end]")
    text = joined(chunks)
    assert text == "Hello from the mock mindie upstream! 你好, 世界 \ufffd"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_full_text_rewrite_never_duplicates(stack: Stack) -> None:
    # Snapshots "Hello" -> "Hello wor" -> "Hello, world" -> "Hello, world!": text already sent is final (SSE cannot
    # take it back) and no character is sent twice: the client reads "Hello world!" (the late comma is lost).
    _, proxy = stack(full_text=True)
    text = joined(stream_deltas(proxy, "qwen", "hi [mock:rewrite]"))
    assert text == "Hello world!"


def test_completions_endpoint_in_full_text_mode(stack: Stack) -> None:
    _, proxy = stack(full_text=True)
    client = proxy.client()
    whole = client.completions.create(model="qwen", prompt="Once upon a time")
    assert whole.id.startswith("cmpl-") and whole.choices[0].text == ANSWER
    parts = [c.choices[0].text for c in client.completions.create(model="qwen", prompt="Once upon a time",
                                                                   stream=True) if c.choices]
    assert "".join(parts) == ANSWER and len([p for p in parts if p]) == 12


# ============================================================================================ role and usage

@pytest.mark.parametrize("full_text", [False, True])
def test_role_once_and_the_sdk_stream_helper(stack: Stack, full_text: bool) -> None:
    _, proxy = stack(full_text=full_text)
    with proxy.client().chat.completions.stream(model="qwen", messages=say("hi")) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert message.role == "assistant"  # MindIE repeats the role in every delta: "assistantassistant…" otherwise
    assert message.content == ANSWER and final.choices[0].finish_reason == "stop"


def test_usage_follows_the_openai_stream_contract(stack: Stack) -> None:
    _, proxy = stack()
    chunks = stream_deltas(proxy, "qwen", "hi", stream_options={"include_usage": True})
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 13 and chunks[-1].usage.prompt_tokens_details.cached_tokens == 0
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-2].choices[0].finish_reason == "stop"  # usage rode on MindIE's finish chunk; not any more
    raw = raw_stream(proxy, {"model": "qwen", "messages": say("hi")})
    assert '"usage"' not in raw and raw.rstrip().endswith("data: [DONE]")


def test_non_stream_usage_keeps_cached_and_reasoning_tokens_only(stack: Stack) -> None:
    _, proxy = stack()
    got = proxy.client().chat.completions.create(model="qwen", messages=say("hi [mock:reasoning_field]"))
    assert got.usage.prompt_tokens_details.cached_tokens == 0
    assert got.usage.completion_tokens_details.reasoning_tokens == 12
    assert got.usage.total_tokens == got.usage.prompt_tokens + got.usage.completion_tokens
    assert not set(MINDIE_ONLY) & set(got.usage.model_extra or {})


# ================================================================================================ reasoning

@pytest.mark.parametrize("full_text", [False, True])
def test_reasoning_field_is_passed_on(stack: Stack, full_text: bool) -> None:
    _, proxy = stack(full_text=full_text)
    chunks = stream_deltas(proxy, "qwen", "hi [mock:reasoning_field]")
    assert joined(chunks, "reasoning_content") == REASONING  # a true delta also in full-text mode
    assert joined(chunks) == ANSWER
    got = proxy.client().chat.completions.create(model="qwen", messages=say("hi [mock:reasoning_field]"))
    assert got.choices[0].message.model_extra["reasoning_content"] == REASONING


@pytest.mark.parametrize("full_text", [False, True])
@pytest.mark.parametrize("directive", ["[mock:think]", "[mock:think,split_tags]"])
def test_inline_think_tags_are_split_out(stack: Stack, full_text: bool, directive: str) -> None:
    _, proxy = stack(full_text=full_text)
    chunks = stream_deltas(proxy, "Qwen3-32B", "hi " + directive)
    assert joined(chunks, "reasoning_content") == REASONING
    assert joined(chunks) == ANSWER
    got = proxy.client().chat.completions.create(model="Qwen3-32B", messages=say("hi " + directive))
    assert got.choices[0].message.content == ANSWER
    assert got.choices[0].message.model_extra["reasoning_content"] == REASONING


@pytest.mark.parametrize("full_text", [False, True])
def test_close_only_think_for_r1_named_models(stack: Stack, full_text: bool) -> None:
    _, proxy = stack(full_text=full_text)
    chunks = stream_deltas(proxy, "DeepSeek-R1", "hi [mock:think_close_only]")
    assert (joined(chunks, "reasoning_content"), joined(chunks)) == (REASONING, ANSWER)
    # Another model name: a lone </think> is not ours to interpret (docs/decisions.md "Reasoning"): it stays.
    other = joined(stream_deltas(proxy, "qwen", "hi [mock:think_close_only]"))
    assert other == REASONING + "</think>\n\n" + ANSWER


def test_thinking_models_setting_starts_listed_models_inside_the_block(stack: Stack) -> None:
    _, proxy = stack(thinking_models=["house-model"])
    got = proxy.client().chat.completions.create(model="house-model", messages=say("hi [mock:think_close_only]"))
    assert got.choices[0].message.content == ANSWER
    assert got.choices[0].message.model_extra["reasoning_content"] == REASONING
    # The client switched thinking off: the model does not start inside a <think> block, its answer is content.
    got = proxy.client().chat.completions.create(model="house-model", messages=say("hi"), reasoning_effort="none")
    assert got.choices[0].message.content == ANSWER


def test_stream_ending_inside_the_thinking_block(stack: Stack) -> None:
    _, proxy = stack(full_text=True)
    chunks = stream_deltas(proxy, "Qwen3-32B", "hi [mock:think_unclosed]")
    assert (joined(chunks, "reasoning_content"), joined(chunks)) == (REASONING, "")
    assert chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.parametrize(("source", "model", "reasoning", "content"), [
    ("field", "Qwen3-32B", "", "<think>" + REASONING + "</think>\n\n" + ANSWER),
    ("off", "Qwen3-32B", "", "<think>" + REASONING + "</think>\n\n" + ANSWER),
    ("tags", "Qwen3-32B", REASONING, ANSWER),
    ("auto", "Qwen3-32B", REASONING, ANSWER),
])
def test_reasoning_source_setting(stack: Stack, source: str, model: str, reasoning: str, content: str) -> None:
    _, proxy = stack(reasoning_source=source)
    chunks = stream_deltas(proxy, model, "hi [mock:think]")
    assert (joined(chunks, "reasoning_content"), joined(chunks)) == (reasoning, content)


@pytest.mark.parametrize("mode", ["reasoning", "think_tags", "none"])
def test_client_reasoning_formats(stack: Stack, mode: str) -> None:
    _, proxy = stack(client={"reasoning": mode})
    got = proxy.client().chat.completions.create(model="qwen", messages=say("hi [mock:reasoning_field]"))
    message = got.choices[0].message
    extra = message.model_extra or {}
    assert "reasoning_content" not in extra
    if mode == "reasoning":
        assert extra["reasoning"] == REASONING and message.content == ANSWER
    elif mode == "think_tags":
        assert message.content == f"<think>{REASONING}</think>\n\n{ANSWER}"
    else:
        assert message.content == ANSWER and "reasoning" not in extra


def test_single_upstream_from_flags_without_a_config_uses_auto(stack: Stack) -> None:
    mock, _ = stack()
    args = parser().parse_args(["serve", "--upstream-url", mock.url, "--upstream-dialect", "mindie"])
    settings = settings_from_args(args, {})
    assert settings.upstreams[0].reasoning_source is None  # the dialect default: auto
    srv = ServerThread(create_app(settings)).start()
    proxy = Proxy(srv, settings)
    try:
        got = proxy.client().chat.completions.create(model="DeepSeek-R1", messages=say("[mock:think_close_only]"))
        assert got.choices[0].message.content == ANSWER
        assert got.choices[0].message.model_extra["reasoning_content"] == REASONING
        got = proxy.client().chat.completions.create(model="Qwen3", messages=say("[mock:think]"))
        assert got.choices[0].message.model_extra["reasoning_content"] == REASONING
    finally:
        proxy.close()
        srv.stop()


# =============================================================================================== tool calls

def test_non_stream_tool_calls(stack: Stack) -> None:
    _, proxy = stack()
    r = httpx.post(proxy.base_url + "/chat/completions", timeout=30,
                   json={"model": "qwen", "messages": say("hi")}).json()
    assert "tool_calls" not in r["choices"][0]["message"]  # MindIE's `tool_calls: []` is dropped
    got = proxy.client().chat.completions.create(model="qwen", messages=say("hi [mock:tool_calls=2]"),
                                                 tools=TOOLS)
    message = got.choices[0].message
    assert message.content is None  # MindIE's "" next to tool calls is OpenAI's null
    assert [c.function.name for c in message.tool_calls] == ["get_weather", "get_weather"]
    assert len({c.id for c in message.tool_calls}) == 2
    assert all(json.loads(c.function.arguments) == {"city": "Paris", "unit": "celsius"} for c in message.tool_calls)
    assert got.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("directive", ["[mock:tool_calls=2]", "[mock:tool_calls_noindex]"])
@pytest.mark.parametrize("full_text", [False, True])
def test_stream_helper_accumulates_tool_calls(stack: Stack, directive: str, full_text: bool) -> None:
    _, proxy = stack(full_text=full_text)
    with proxy.client().chat.completions.stream(model="qwen", messages=say("hi " + directive), tools=TOOLS) as s:
        for event in s:
            if event.type == "chunk":
                for call in event.chunk.choices[0].delta.tool_calls or () if event.chunk.choices else ():
                    assert isinstance(call.index, int)
        final = s.get_final_completion()
    choice = final.choices[0]
    calls = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls"
    assert len(calls) == (2 if "=2" in directive else 1)
    for call in calls:
        assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}


# ================================================================================ MindIE-only fields and ids

def test_mindie_only_fields_never_reach_clients_but_reach_metrics(stack: Stack) -> None:
    _, proxy = stack(full_text=True)
    body = {"model": "qwen", "messages": say("hi")}
    raw = httpx.post(proxy.base_url + "/chat/completions", json=body, timeout=30).text
    raw += raw_stream(proxy, {**body, "stream_options": {"include_usage": True}})
    for key in MINDIE_ONLY:
        assert key not in raw, key
    metrics = httpx.get(proxy.url + "/metrics", timeout=10).text
    count = [line for line in metrics.splitlines()
             if line.startswith("dialect_proxy_upstream_prefill_seconds_count") and 'upstream="mi"' in line]
    assert count and float(count[0].rsplit(" ", 1)[1]) >= 1
    queue = [line for line in metrics.splitlines()
             if line.startswith("dialect_proxy_upstream_queue_wait_seconds_count") and 'upstream="mi"' in line]
    assert queue and float(queue[0].rsplit(" ", 1)[1]) >= 13


def test_ids_are_ours_unless_the_upstream_id_is_kept(stack: Stack) -> None:
    mock, proxy = stack()
    got = proxy.client().chat.completions.create(model="qwen", messages=say("hi"))
    assert got.id.startswith("chatcmpl-") and "endpoint_common" not in got.id
    mock, keep = stack(keep_upstream_id=True)
    got = keep.client().chat.completions.create(model="qwen", messages=say("hi"))
    assert got.id == mock.last_request()["headers"]["req-id"]  # MindIE answers with its req-id as the id
    chunks = stream_deltas(keep, "qwen", "hi")
    assert {c.id for c in chunks} == {mock.last_request()["headers"]["req-id"]}


# ================================================================================================= requests

def test_request_is_mapped_to_what_mindie_accepts(stack: Stack) -> None:
    mock, proxy = stack(mock_kw={"served_model": "Qwen2.5-VL-7B"}, models=["vision"],
                        aliases={"gpt-4o": "Qwen2.5-VL-7B"})
    messages = [
        {"role": "developer", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "text", "text": "What is in the picture?"},
                                     {"type": "image_url", "image_url": {"url": "https://example.com/cat.png",
                                                                         "detail": "low"}}]},
    ]
    got = proxy.client().chat.completions.create(
        model="gpt-4o", messages=messages, tools=TOOLS, stream=True, stream_options={"include_usage": True},
        max_completion_tokens=40, reasoning_effort="low", top_p=0, temperature=0.7, user="u-1", store=False,
        parallel_tool_calls=False, metadata={"k": "v"})
    assert "".join(c.choices[0].delta.content or "" for c in got if c.choices) == ANSWER
    sent = mock.last_request()
    body = sent["body"]
    assert body["model"] == "Qwen2.5-VL-7B"
    assert body["messages"][0] == {"role": "system", "content": "Answer briefly."}
    assert body["messages"][1]["content"][1] == {"type": "image_url", "image_url": "https://example.com/cat.png"}
    assert body["max_tokens"] == 40 and body["top_p"] == 1e-5 and body["temperature"] == 0.7
    assert body["chat_template_kwargs"] == {"enable_thinking": True}
    for key in ("stream_options", "max_completion_tokens", "reasoning_effort", "user", "store",
                "parallel_tool_calls", "metadata"):
        assert key not in body, key
    assert sent["headers"]["req-id"].startswith(sent["headers"]["x-request-id"] + "-")


def test_req_id_is_unique_per_attempt_even_when_the_client_reuses_its_request_id(stack: Stack) -> None:
    mock, proxy = stack()
    client = proxy.client()
    seen = []
    for _ in range(2):
        client.chat.completions.create(model="qwen", messages=say("hi"), extra_headers={"x-request-id": "same"})
        headers = mock.last_request()["headers"]
        assert headers["x-request-id"] == "same"
        seen.append(headers["req-id"])
    assert seen[0] != seen[1] and all(s.startswith("same-") for s in seen)


@pytest.mark.parametrize(("kw", "param"), [
    ({"temperature": 2.5}, "temperature"),
    ({"top_p": -1}, "top_p"),
    ({"stop": ["x"] * 1025}, "stop"),
    ({"stop": "y" * 1025}, "stop"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": 2**31}, "max_tokens"),
    ({"n": 200}, "n"),
    ({"n": 2, "temperature": 0}, "n"),
    ({"presence_penalty": -2.5}, "presence_penalty"),
    ({"frequency_penalty": 3}, "frequency_penalty"),
    ({"seed": -5}, "seed"),
    ({"top_logprobs": 30, "logprobs": True}, "top_logprobs"),
    ({"extra_body": {"top_k": 0}}, "top_k"),
])
def test_parameters_mindie_would_refuse_are_refused_early_and_named(stack: Stack, kw: dict[str, Any],
                                                                    param: str) -> None:
    mock, proxy = stack()
    mock.reset()
    with pytest.raises(openai.BadRequestError) as e:
        proxy.client().chat.completions.create(model="qwen", messages=say("hi"), **kw)
    assert e.value.body["param"] == param and param in e.value.body["message"]
    assert e.value.response.headers["x-should-retry"] == "false"
    assert mock.stats()["requests"] == 0  # never sent


def test_several_answers_get_openai_default_temperature(stack: Stack) -> None:
    mock, proxy = stack()
    got = proxy.client().chat.completions.create(model="qwen", messages=say("hi"), n=2)
    assert [c.index for c in got.choices] == [0, 1] and mock.last_request()["body"]["temperature"] == 1.0
    chunks = stream_deltas(proxy, "qwen", "hi", n=2)
    for index in (0, 1):
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == index)
        assert text == ANSWER


# =================================================================================================== errors

ERRORS = [
    ("[mock:error=422]", openai.BadRequestError, 400, "invalid_request_error", "Input validation error"),
    ("[mock:error=400]", openai.BadRequestError, 400, "invalid_request_error", "Bad Request"),
    # a 404 not about the model: the path is missing there (a wrong URL or dialect), a 502 that says so
    ("[mock:error=404]", openai.InternalServerError, 502, "upstream_error", "POST /v1/chat/completions"),
    ("[mock:error=413]", openai.APIStatusError, 413, "invalid_request_error", "Request body too large"),
    ("[mock:error=424]", openai.InternalServerError, 502, "upstream_error", "Generation failed"),
    ("[mock:error=500]", openai.InternalServerError, 502, "upstream_error", "Engine callback timeout"),
    ("[mock:error=raw500]", openai.InternalServerError, 502, "upstream_error", "Server internal error"),
    ("[mock:error=503]", openai.InternalServerError, 503, "service_unavailable", "503"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("directive", "exc", "status", "type_", "message"), ERRORS)
def test_mindie_errors_become_openai_errors(stack: Stack, stream: bool, directive: str, exc: type[Exception],
                                            status: int, type_: str, message: str) -> None:
    _, proxy = stack()
    with pytest.raises(exc) as e:
        proxy.client().chat.completions.create(model="qwen", messages=say(directive), stream=stream)
    err = e.value
    assert isinstance(err, openai.APIStatusError)
    assert err.status_code == status and err.body["type"] == type_ and message in err.body["message"]
    assert err.response.headers.get("x-should-retry") == ("false" if status < 500 else None)


@pytest.mark.parametrize("stream", [False, True])
def test_model_not_found_is_404(stack: Stack, stream: bool) -> None:
    _, proxy = stack(mock_kw={"served_model": "Qwen2.5-VL-7B"})
    with pytest.raises(openai.NotFoundError) as e:
        proxy.client().chat.completions.create(model="qwen-typo", messages=say("hi"), stream=stream)
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"
    assert "Model not found" in e.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        proxy.client().completions.create(model="qwen-typo", prompt="x", stream=stream)


@pytest.mark.parametrize(("directive", "said", "partial"), [
    ("[mock:raw_timeout=5]", "Engine callback timeout: server tokenTimeout", True),
    ("[mock:drop=5]", "broke in the middle of the stream", True),
    ("[mock:no_finish]", "without a finish_reason", True),
    # Within the first texts. Without full_text they wait until their form (cumulative or not) is known: the error
    # alone, as an HTTP status (proxy/hub/pipeline.py). With it the texts that extend the one before go at once, so
    # the client has what came in the reads before the failure (all of it may come in the failure's read).
    ("[mock:bad_json]", "not valid JSON", False),
    ("[mock:drop=2]", "broke in the middle of the stream", False),
])
@pytest.mark.parametrize("full_text", [False, True])
def test_broken_streams_raise_in_the_sdk_after_the_partial_answer(stack: Stack, directive: str, said: str,
                                                                   partial: bool, full_text: bool) -> None:
    _, proxy = stack(full_text=full_text)
    got: list[Any] = []
    with pytest.raises(openai.APIError) as e:
        stream = proxy.client().chat.completions.create(model="qwen", messages=say("hi " + directive), stream=True)
        got.extend(stream)
    assert said in e.value.message
    if partial or (full_text and joined(got)):
        assert joined(got).startswith("Hello")  # what arrived before the failure was relayed
        assert not isinstance(e.value, openai.APIStatusError)
    else:
        assert isinstance(e.value, openai.APIStatusError) and e.value.status_code == 502 and got == []


def test_broken_stream_is_never_a_clean_end_on_the_wire(stack: Stack) -> None:
    _, proxy = stack()
    raw = raw_stream(proxy, {"model": "qwen", "messages": say("hi [mock:raw_timeout]")})
    last = raw.strip().splitlines()[-1]
    assert "[DONE]" not in raw and json.loads(last[len("data: "):])["error"]["type"] == "upstream_error"


def test_raw_failure_before_any_token_is_an_http_error_not_a_200_stream(stack: Stack) -> None:
    # MindIE's raw `Engine callback timeout` as the very first bytes of the event stream.
    _, proxy = stack(full_text=True)
    r = httpx.post(proxy.base_url + "/chat/completions", timeout=30, json={
        "model": "qwen", "stream": True, "messages": [{"role": "user", "content": "[mock:raw_timeout=0]"}]})
    assert r.status_code == 502 and r.headers["content-type"].startswith("application/json")
    assert "Engine callback timeout" in r.json()["error"]["message"]
