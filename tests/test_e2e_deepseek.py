"""End to end: the official openai SDK -> proxy -> built-in mock DeepSeek upstream (strict like the real API).

Each test names the feature it shows; without that feature the mock (or the assertion on what reached it) fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.conftest import Mock, ServerThread

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
THINKING = {"thinking": {"type": "enabled"}}


@pytest.fixture(scope="module")
def _deepseek_mock() -> Iterator[Mock]:
    from proxy.mock import create_app

    srv = ServerThread(create_app("deepseek")).start()
    try:
        yield Mock(srv, "deepseek")
    finally:
        srv.stop()


@pytest.fixture
def mock(_deepseek_mock: Mock) -> Mock:
    """One mock DeepSeek for the module (it is stateless), its counters and last request reset for each test."""
    _deepseek_mock.reset()
    return _deepseek_mock


class _OneClient:
    """A started proxy whose `client()` is one openai client, closed after the test: a client per call costs an
    SSL context (~50 ms) and leaves pooled sockets to the garbage collector (a ResourceWarning, an error here)."""

    def __init__(self, proxy: Any) -> None:
        self._proxy = proxy
        self._client: openai.OpenAI | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._proxy, name)

    def client(self) -> openai.OpenAI:
        if self._client is None:
            self._client = self._proxy.client()
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


@pytest.fixture(name="start_proxy")
def one_client_start_proxy(start_proxy: Callable[..., Any]) -> Iterator[Callable[..., Any]]:
    """conftest's `start_proxy`, with one openai client per proxy (imported by the other e2e modules of issue 4)."""
    started: list[_OneClient] = []

    def start(*args: Any, **kw: Any) -> _OneClient:
        proxy = _OneClient(start_proxy(*args, **kw))
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.close()


def collect(stream: Any) -> dict[str, Any]:
    """Accumulate an SDK chat stream into {content, reasoning_content, reasoning, tool_calls, finish, chunks}."""
    out: dict[str, Any] = {"content": "", "reasoning_content": "", "reasoning": "", "tool_calls": {},
                           "finish": [], "chunks": [], "roles": []}
    for chunk in stream:
        out["chunks"].append(chunk)
        for choice in chunk.choices:
            delta = choice.delta
            out["content"] += delta.content or ""
            extra = delta.model_extra or {}
            out["reasoning_content"] += extra.get("reasoning_content") or ""
            out["reasoning"] += extra.get("reasoning") or ""
            if delta.role:
                out["roles"].append(delta.role)
            for tc in delta.tool_calls or ():
                call = out["tool_calls"].setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = call["id"] or tc.id
                if tc.function is not None:
                    call["name"] += tc.function.name or ""
                    call["arguments"] += tc.function.arguments or ""
            if choice.finish_reason:
                out["finish"].append(choice.finish_reason)
    return out


def as_message(got: dict[str, Any], field: str) -> dict[str, Any]:
    """The assistant message a streaming client builds from what it received (and sends back next turn)."""
    msg: dict[str, Any] = {"role": "assistant", "content": got["content"] or None}
    if got[field]:
        msg[field] = got[field]
    if got["tool_calls"]:
        msg["tool_calls"] = [{"id": c["id"], "type": "function",
                              "function": {"name": c["name"], "arguments": c["arguments"]}}
                             for _, c in sorted(got["tool_calls"].items())]
    return msg


def sent(mock: Any) -> dict[str, Any]:
    body: dict[str, Any] = mock.last_request()["body"]
    return body


# ------------------------------------------------------------------------------------ reasoning replay (R1)

@pytest.mark.parametrize("mode", ["reasoning_content", "reasoning", "think_tags"])
@pytest.mark.parametrize("stream", [False, True])
def test_r1_client_round_tripping_its_reasoning_just_works(mock, start_proxy, mode, stream) -> None:
    """Replay policy: R1-era models get no reasoning back (R1 400s on it); a DeepSeek-compatible host serving R1."""
    proxy = start_proxy(mock=mock, client={"reasoning": mode})
    client = proxy.client()
    history: list[Any] = [{"role": "user", "content": "Hi"}]
    if stream:
        got = collect(client.chat.completions.create(model="deepseek-r1", messages=history, stream=True))
        field = "content" if mode == "think_tags" else mode
        assert got[field]
        history.append(as_message(got, mode if mode != "think_tags" else "reasoning_content"))
    else:
        first = client.chat.completions.create(model="deepseek-r1", messages=history)
        history.append(first.choices[0].message)  # the SDK object itself, extras included
    history.append({"role": "user", "content": "And again?"})
    again = client.chat.completions.create(model="deepseek-r1", messages=history, stream=stream)
    if stream:
        assert collect(again)["finish"] == ["stop"]
    else:
        assert again.choices[0].message.content
    replayed = sent(mock)["messages"][1]
    assert replayed["role"] == "assistant" and replayed["content"].startswith("Hello from the mock deepseek")
    assert "reasoning_content" not in replayed and "reasoning" not in replayed
    assert "<think>" not in replayed["content"]


# ------------------------------------------------------------------------- reasoning replay (thinking mode)

@pytest.mark.parametrize("mode", ["reasoning_content", "reasoning", "think_tags", "none"])
@pytest.mark.parametrize("stream", [False, True])
def test_thinking_mode_tool_turn_round_trip_keeps_reasoning(mock, start_proxy, mode, stream) -> None:
    """Replay policy: on tool-call turns the reasoning is kept, as `reasoning_content` (thinking mode 400s
    without it), whatever form the client received it in — even none at all (`client.reasoning: none`): the proxy
    restores what it recorded (proxy/hub/continuity.py)."""
    proxy = start_proxy(mock=mock, client={"reasoning": mode})
    client = proxy.client()
    history: list[Any] = [{"role": "user", "content": "Weather in Paris? [mock:tool_calls]"}]
    kw: dict[str, Any] = {"model": "deepseek-chat", "tools": TOOLS, "extra_body": THINKING}
    if stream:
        got = collect(client.chat.completions.create(messages=history, stream=True, **kw))
        assert got["finish"] == ["tool_calls"] and got["tool_calls"][0]["name"] == "get_weather"
        message: Any = as_message(got, mode if mode in ("reasoning_content", "reasoning") else "content")
        call_id = got["tool_calls"][0]["id"]
    else:
        first = client.chat.completions.create(messages=history, **kw)
        assert first.choices[0].finish_reason == "tool_calls"
        message = first.choices[0].message
        call_id = message.tool_calls[0].id
    history += [message, {"role": "tool", "tool_call_id": call_id, "content": "sunny, 21°C"}]
    again = client.chat.completions.create(messages=history, stream=stream, **kw)
    if stream:
        collect(again)
    replayed = sent(mock)["messages"][1]
    assert replayed["reasoning_content"] == "The user greets me; 先想一想 🤔 then answer politely."
    assert "reasoning" not in replayed and replayed["tool_calls"][0]["id"] == call_id


def test_r1_tool_history_is_stripped_by_auto_and_keep_overrides(mock, start_proxy) -> None:
    """`reasoning_replay: auto` is `strip` for an R1-era model, even on tool-call turns; `keep` sends it as is."""
    history = [{"role": "user", "content": "Weather?"},
               {"role": "assistant", "content": None, "reasoning_content": "call it",
                "tool_calls": [{"id": "call_1", "type": "function",
                                "function": {"name": "get_weather", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    keep = start_proxy(mock=mock, reasoning_replay="keep")
    with pytest.raises(openai.BadRequestError) as e:
        keep.client().chat.completions.create(model="deepseek-r1", messages=history)
    assert "reasoning_content" in e.value.message
    auto = start_proxy(mock=mock)
    got = auto.client().chat.completions.create(model="deepseek-r1", messages=history)
    assert got.choices[0].message.content and "reasoning_content" not in sent(mock)["messages"][1]


# --------------------------------------------------------------------------------------------- R1 rules

@pytest.mark.parametrize("stream", [False, True])
def test_r1_successive_same_role_messages_are_merged(mock, start_proxy, stream) -> None:
    proxy = start_proxy(mock=mock)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Part one."},
                {"role": "user", "content": "Part two."}]
    got = proxy.client().chat.completions.create(model="deepseek-r1", messages=messages, stream=stream)
    if stream:
        assert collect(got)["finish"] == ["stop"]
    else:
        assert got.choices[0].finish_reason == "stop"
    assert sent(mock)["messages"][1:] == [{"role": "user", "content": "Part one.\n\nPart two."}]


@pytest.mark.parametrize("stream", [False, True])
def test_r1_logprobs_get_a_clear_400_from_the_proxy(mock, start_proxy, stream) -> None:
    proxy = start_proxy(mock=mock)
    with pytest.raises(openai.BadRequestError) as e:
        proxy.client().chat.completions.create(model="deepseek-r1", messages=[{"role": "user", "content": "x"}],
                                               logprobs=True, top_logprobs=2, stream=stream)
    assert e.value.body["param"] == "logprobs" and "deepseek-r1" in e.value.message
    assert e.value.response.headers["x-should-retry"] == "false"
    assert mock.stats()["requests"] == 0


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_choice_turns_thinking_off(mock, start_proxy, stream) -> None:
    proxy = start_proxy(mock=mock)
    got = proxy.client().chat.completions.create(
        model="deepseek-chat", messages=[{"role": "user", "content": "Weather? [mock:tool_calls]"}], tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, extra_body=THINKING, stream=stream)
    if stream:
        assert collect(got)["tool_calls"][0]["name"] == "get_weather"
    else:
        assert got.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert sent(mock)["thinking"] == {"type": "disabled"}


def test_reasoning_effort_switches_thinking_on(mock, start_proxy) -> None:
    """`deepseek-chat` (retired) is V4 Flash without thinking; an effort asks for thinking, graded DeepSeek's way."""
    proxy = start_proxy(mock=mock)
    got = proxy.client().chat.completions.create(model="deepseek-chat", reasoning_effort="medium",
                                                 messages=[{"role": "user", "content": "Hi"}])
    assert got.choices[0].message.model_extra["reasoning_content"]
    body = sent(mock)
    assert body["thinking"] == {"type": "enabled"} and body["reasoning_effort"] == "high"
    assert body["model"] == "deepseek-v4-flash"
    got = proxy.client().chat.completions.create(model="deepseek-chat", messages=[{"role": "user", "content": "Hi"}])
    assert "reasoning_content" not in (got.choices[0].message.model_extra or {})
    assert sent(mock)["thinking"] == {"type": "disabled"}
    got = proxy.client().chat.completions.create(model="deepseek-v4-pro", reasoning_effort="none",
                                                 messages=[{"role": "user", "content": "Hi"}])
    assert sent(mock)["thinking"] == {"type": "disabled"} and "reasoning_effort" not in sent(mock)


def test_retired_names_reach_deepseek_as_v4_flash(mock, start_proxy) -> None:
    """The live API refuses `deepseek-reasoner` (as the mock does); through the proxy it is V4 Flash thinking."""
    direct = httpx.post(mock.url + "/chat/completions", timeout=10,
                        json={"model": "deepseek-reasoner", "messages": [{"role": "user", "content": "Hi"}]})
    assert direct.status_code == 400 and direct.json()["error"]["message"] == "Model Not Exist"
    proxy = start_proxy(mock=mock)
    hi = [{"role": "user", "content": "Hi"}]
    got = proxy.client().chat.completions.create(model="deepseek-reasoner", messages=hi)
    assert got.model == "deepseek-reasoner" and got.choices[0].message.model_extra["reasoning_content"]
    assert sent(mock)["model"] == "deepseek-v4-flash" and sent(mock)["thinking"] == {"type": "enabled"}


# -------------------------------------------------------------------------------------------------- usage

@pytest.mark.parametrize("user", ["Hi", "Hi [mock:cache_fields_only]"])  # with/without prompt_tokens_details
def test_non_stream_usage_maps_cache_hits_and_keeps_reasoning_tokens(mock, start_proxy, user) -> None:
    proxy = start_proxy(mock=mock)
    messages = [{"role": "system", "content": "You are a helpful assistant. " * 40}, {"role": "user", "content": user}]
    direct = httpx.post(mock.url + "/chat/completions", timeout=10,
                        json={"model": "deepseek-flash", "messages": messages}).json()["usage"]
    assert direct["prompt_cache_hit_tokens"] > 0
    usage = proxy.client().chat.completions.create(model="deepseek-reasoner", messages=messages).usage
    assert usage.prompt_tokens_details.cached_tokens == direct["prompt_cache_hit_tokens"]
    assert usage.completion_tokens_details.reasoning_tokens == direct["completion_tokens_details"]["reasoning_tokens"]
    assert "prompt_cache_hit_tokens" not in (usage.model_extra or {})  # OpenAI clients get OpenAI fields


def test_stream_usage_follows_include_usage_exactly(mock, start_proxy) -> None:
    """DeepSeek's usage rides on its finish chunk (non-empty choices): clients get OpenAI's placement."""
    proxy = start_proxy(mock=mock)
    messages = [{"role": "user", "content": "Hi " * 200}]
    got = collect(proxy.client().chat.completions.create(model="deepseek-reasoner", messages=messages, stream=True,
                                                         stream_options={"include_usage": True}))
    chunks = got["chunks"]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens > 0
    assert all(c.usage is None for c in chunks[:-1]) and got["finish"] == ["stop"]
    raw = httpx.post(proxy.base_url + "/chat/completions", timeout=30,
                     json={"model": "deepseek-reasoner", "messages": messages, "stream": True})
    assert '"usage"' not in raw.text and raw.text.rstrip().endswith("data: [DONE]")


# ------------------------------------------------------------------------------------------------ streams

def test_keepalive_comments_and_the_reasoner_first_delta(mock, start_proxy) -> None:
    proxy = start_proxy(mock=mock)
    messages = [{"role": "user", "content": "Hi [mock:keepalive]"}]
    whole = proxy.client().chat.completions.create(model="deepseek-reasoner", messages=messages)
    got = collect(proxy.client().chat.completions.create(model="deepseek-reasoner", messages=messages,
                                                         stream=True))
    assert got["content"] == whole.choices[0].message.content
    assert got["reasoning_content"] == whole.choices[0].message.model_extra["reasoning_content"]
    assert got["roles"] == ["assistant"]
    first, *middle, last = got["chunks"]
    assert first.choices[0].delta.content == "" and first.choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.content or c.choices[0].delta.model_extra.get("reasoning_content")
               for c in middle), "no chunk without payload between the role chunk and the finish chunk"
    assert last.choices[0].finish_reason == "stop"
    raw = httpx.post(proxy.base_url + "/chat/completions", timeout=30,
                     json={"model": "deepseek-reasoner", "messages": messages, "stream": True}).text
    events = [e for e in raw.split("\n\n") if e.strip()]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    for e in events[:-1]:
        orjson.loads(e[len("data: "):])


# ------------------------------------------------------------------------------------ honest finish reasons

def test_insufficient_system_resource_is_a_retryable_503_not_a_stop(mock, start_proxy) -> None:
    proxy = start_proxy(mock=mock)
    messages = [{"role": "user", "content": "Hi [mock:insufficient_resource]"}]
    with pytest.raises(openai.InternalServerError) as e:
        proxy.client().chat.completions.create(model="deepseek-chat", messages=messages)
    assert e.value.status_code == 503 and e.value.body["code"] == "insufficient_system_resource"
    assert e.value.body["type"] == "service_unavailable"
    assert "x-should-retry" not in e.value.response.headers  # the SDK retries a 503 by default

    received = ""
    with pytest.raises(openai.APIError) as e2:
        for chunk in proxy.client().chat.completions.create(model="deepseek-chat", messages=messages, stream=True):
            for choice in chunk.choices:
                assert choice.finish_reason is None
                received += choice.delta.content or ""
    assert received and "Hello from the mock deepseek upstream!".startswith(received.strip()[:10])
    assert "insufficient_system_resource" in e2.value.message
    raw = httpx.post(proxy.base_url + "/chat/completions", timeout=30,
                     json={"model": "deepseek-chat", "messages": messages, "stream": True}).text
    assert "[DONE]" not in raw and '"finish_reason":"insufficient_system_resource"' not in raw
    assert orjson.loads(raw.strip().split("\n\n")[-1][len("data: "):])["error"]["code"] == \
        "insufficient_system_resource"


# ------------------------------------------------------------------------------------------------- errors

@pytest.mark.parametrize("stream", [False, True])
def test_402_stays_402_and_429_keeps_retry_after(mock, start_proxy, stream) -> None:
    proxy = start_proxy(mock=mock)
    with pytest.raises(openai.APIStatusError) as e:
        proxy.client().chat.completions.create(model="deepseek-chat", stream=stream,
                                               messages=[{"role": "user", "content": "x [mock:error=402]"}])
    assert e.value.status_code == 402 and e.value.body["code"] == "insufficient_quota"
    assert e.value.body["type"] == "insufficient_quota" and e.value.body["message"] == "Insufficient Balance"
    assert e.value.response.headers["x-should-retry"] == "false"
    with pytest.raises(openai.RateLimitError) as e2:
        proxy.client().chat.completions.create(model="deepseek-chat", stream=stream,
                                               messages=[{"role": "user", "content": "x [mock:error=429]"}])
    assert e2.value.response.headers["retry-after"] == "7" and e2.value.body["code"] == "rate_limited"


# -------------------------------------------------------------------------------------- request parameters

def test_request_parameters_per_the_spec(mock, start_proxy) -> None:
    proxy = start_proxy(mock=mock)
    client = proxy.client()
    msg = [{"role": "user", "content": "Hi"}]
    # max_tokens above V4's 384K is lowered (the upstream would refuse it); 0 is refused by us.
    assert client.chat.completions.create(model="deepseek-chat", messages=msg, max_tokens=400000).choices
    assert sent(mock)["max_tokens"] == 384000
    client.chat.completions.create(model="deepseek-chat", messages=msg, max_completion_tokens=64)
    assert sent(mock)["max_tokens"] == 64 and "max_completion_tokens" not in sent(mock)
    assert client.chat.completions.create(model="deepseek-chat", messages=msg,
                                          response_format={"type": "json_object"}).choices
    assert sent(mock)["response_format"] == {"type": "json_object"}
    # `developer` (newer OpenAI SDK apps) is DeepSeek's `system` (the upstream refuses the role).
    assert client.chat.completions.create(model="deepseek-chat", messages=[
        {"role": "developer", "content": "Be brief."}, *msg]).choices
    assert sent(mock)["messages"][0] == {"role": "system", "content": "Be brief."}
    mock.reset()
    refused: list[tuple[dict[str, Any], str]] = [
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": [f"s{i}" for i in range(17)]}, "stop"),
        ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]}, "tools"),
        ({"n": 2}, "n"),  # (a json_schema is emulated: tests/test_e2e_structured.py)
    ]
    for kw, param in refused:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="deepseek-chat", messages=msg, **kw)
        assert e.value.body["param"] == param, kw
    assert mock.stats()["requests"] == 0


# ------------------------------------------------------------------------------------ DeepSeek-dialect clients

@pytest.mark.parametrize("stream", [False, True])
def test_prefix_continuation_goes_to_the_beta_route(mock, start_proxy, stream) -> None:
    proxy = start_proxy(mock=mock)
    messages = [{"role": "user", "content": "Write a poem"},
                {"role": "assistant", "content": "Roses are", "reasoning_content": "a short poem", "prefix": True}]
    got = proxy.client().chat.completions.create(model="deepseek-reasoner", messages=messages, stream=stream)
    if stream:
        assert collect(got)["finish"] == ["stop"]
    else:
        assert got.choices[0].message.content
    last = mock.last_request()
    assert last["path"] == "/beta/chat/completions"
    assert last["body"]["messages"][-1] == messages[-1]


def test_usage_fields_deepseek_adds_cache_counts(mock, start_proxy) -> None:
    proxy = start_proxy(mock=mock, client={"usage_fields": "deepseek"})
    messages = [{"role": "system", "content": "Context. " * 100}, {"role": "user", "content": "Hi"}]
    usage = proxy.client().chat.completions.create(model="deepseek-chat", messages=messages).usage
    extra = usage.model_extra or {}
    assert extra["prompt_cache_hit_tokens"] == usage.prompt_tokens_details.cached_tokens > 0
    assert extra["prompt_cache_hit_tokens"] + extra["prompt_cache_miss_tokens"] == usage.prompt_tokens
    chunks = collect(proxy.client().chat.completions.create(
        model="deepseek-chat", messages=messages, stream=True, stream_options={"include_usage": True}))["chunks"]
    extra = chunks[-1].usage.model_extra or {}
    assert extra["prompt_cache_hit_tokens"] + extra["prompt_cache_miss_tokens"] == chunks[-1].usage.prompt_tokens
