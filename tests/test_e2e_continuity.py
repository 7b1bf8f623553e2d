"""End to end: reasoning continuity (proxy/hub/continuity.py) — agents whose clients drop `reasoning_content` when they
build history run a two-tool-turn loop against the strict DeepSeek mock in thinking mode (DeepSeek's default). Sent
directly, their second request is refused with DeepSeek's 400; through the proxy it passes, with the original
reasoning restored exactly. A turn the proxy never saw (another replica's store, a restarted store) gets the empty
reasoning and no 400. R1-era models on MindIE get no reasoning back.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from proxy.mock.deepseek import PASS_BACK
from proxy.mock.textgen import REASONING
from tests import test_e2e_deepseek
from tests.test_e2e_deepseek import collect

# What a DeepSeek tool-call turn the proxy never saw carries (docs/deepseek.md "Reasoning continuity").
PLACEHOLDER = "(reasoning not available)"

# The DeepSeek mock fixtures (one strict mock per module, reset for each test) of tests/test_e2e_deepseek.py.
_deepseek_mock = test_e2e_deepseek._deepseek_mock
mock = test_e2e_deepseek.mock

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
WEATHER = {"Paris": "sunny, 21°C", "Rome": "rain, 17°C"}


def weather(arguments: str) -> str:
    import json

    return WEATHER.get(json.loads(arguments or "{}").get("city", "Paris"), "cloudy")


def sdk_agent(client: openai.OpenAI, model: str, stream: bool) -> tuple[list[dict[str, Any]], list[str]]:
    """A two-tool-turn agent as most OpenAI-style apps write it: history keeps content and tool_calls, and drops
    `reasoning_content`. Returns the last history and the reasoning the client received on each tool-call turn."""
    history: list[dict[str, Any]] = []
    received: list[str] = []
    for question in ("Weather in Paris? [mock:call_tool=get_weather {\"city\": \"Paris\"}]",
                     "And in Rome? [mock:call_tool=get_weather {\"city\": \"Rome\"}]"):
        history.append({"role": "user", "content": question})
        for _ in range(3):  # bounded: a call, then the answer quoting its result
            if stream:
                got = collect(client.chat.completions.create(model=model, messages=history, tools=TOOLS,
                                                             stream=True))
                content, reasoning = got["content"], got["reasoning_content"]
                calls = [{"id": c["id"], "type": "function", "function": {"name": c["name"],
                                                                           "arguments": c["arguments"]}}
                         for _, c in sorted(got["tool_calls"].items())]
            else:
                message = client.chat.completions.create(model=model, messages=history, tools=TOOLS).choices[0].message
                content, reasoning = message.content or "", (message.model_extra or {}).get("reasoning_content", "")
                calls = [c.model_dump(include={"id", "type", "function"}) for c in message.tool_calls or ()]
            turn: dict[str, Any] = {"role": "assistant", "content": content}  # no reasoning_content
            if not calls:
                history.append(turn)
                break
            received.append(reasoning)
            history.append({**turn, "tool_calls": calls})
            history += [{"role": "tool", "tool_call_id": c["id"], "content": weather(c["function"]["arguments"])}
                        for c in calls]
    return history, received


def tool_turns(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m["role"] == "assistant" and m.get("tool_calls")]


def continuity_counts(proxy: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(proxy.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("dialect_proxy_reasoning_continuity_total{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('event="')[1].split('"')[0]] = float(value)
    return out


# ------------------------------------------------------------------------------------------------ openai SDK

@pytest.mark.parametrize("stream", [False, True])
def test_sdk_agent_dropping_reasoning_fails_directly_and_passes_through_the_proxy(mock, start_proxy, stream) -> None:
    direct = openai.OpenAI(base_url=mock.url, api_key="sk-x", max_retries=0, timeout=30)
    try:
        with pytest.raises(openai.BadRequestError) as e:
            sdk_agent(direct, "deepseek-flash", stream)
        assert e.value.status_code == 400 and e.value.body["message"] == PASS_BACK
    finally:
        direct.close()

    proxy = start_proxy(mock=mock)
    history, received = sdk_agent(proxy.client(), "deepseek-flash", stream)
    assert history[-1]["content"] and "rain, 17°C" in history[-1]["content"]  # the loop ran to its end
    assert len(received) == 2 and all(r == REASONING for r in received)
    last = mock.last_request()["body"]
    assert "thinking" not in last  # thinking mode stayed on (DeepSeek's default), nothing was switched off
    turns = tool_turns(last)
    assert [t["reasoning_content"] for t in turns] == received  # the original text, exactly
    assert [t["tool_calls"][0]["id"] for t in turns] == [m["tool_calls"][0]["id"] for m in history
                                                         if m.get("tool_calls")]
    counts = continuity_counts(proxy)
    # turn 1 restored in requests 2, 3 and 4; turn 2 in request 4: four restores, no fallback, two recorded turns
    assert counts == {"recorded": 2, "restored": 4}


def test_a_turn_never_seen_gets_the_placeholder_not_a_400(mock, start_proxy) -> None:
    """History from elsewhere — here another proxy whose store this one does not share (a restarted memory store
    is the same) — gets the fixed, non-empty placeholder (the mock refuses an empty `reasoning_content` there)."""
    first = start_proxy(mock=mock)
    history, _ = sdk_agent(first.client(), "deepseek-v4-pro", stream=True)
    second = start_proxy(mock=mock)
    history.append({"role": "user", "content": "Thanks!"})
    got = second.client().chat.completions.create(model="deepseek-v4-pro", messages=history, tools=TOOLS)
    assert got.choices[0].message.content
    assert [t["reasoning_content"] for t in tool_turns(mock.last_request()["body"])] == [PLACEHOLDER] * 2
    assert continuity_counts(second) == {"fallback": 2}
    # while the first proxy still knows them
    first.client().chat.completions.create(model="deepseek-v4-pro", messages=history, tools=TOOLS)
    assert [t["reasoning_content"] for t in tool_turns(mock.last_request()["body"])] == [REASONING, REASONING]


def test_retired_deepseek_reasoner_tool_loop_works_and_is_not_r1(mock, start_proxy) -> None:
    proxy = start_proxy(mock=mock)
    history, received = sdk_agent(proxy.client(), "deepseek-reasoner", stream=False)
    assert len(received) == 2 and "rain, 17°C" in history[-1]["content"]
    last = mock.last_request()["body"]
    assert last["model"] == "deepseek-v4-flash" and last["thinking"] == {"type": "enabled"}
    assert [t["reasoning_content"] for t in tool_turns(last)] == received


def test_non_thinking_requests_touch_no_store(mock, start_proxy) -> None:
    proxy = start_proxy(mock=mock)
    history, received = sdk_agent(proxy.client(), "deepseek-chat", stream=True)
    assert received == ["", ""] and "rain, 17°C" in history[-1]["content"]
    assert all("reasoning_content" not in t for t in tool_turns(mock.last_request()["body"]))
    assert continuity_counts(proxy) == {}


# -------------------------------------------------------------------------------------------------- LangChain

def langchain_agent(base_url: str, **options: Any) -> list[Any]:
    """LangChain's ChatOpenAI with a weather tool, two questions, each until the model stops calling tools (bounded):
    the conversation's messages. Every answer must hold REASONING in a `reasoning` block when `output_version` is
    v1 (LangChain's standard blocks; the Responses API with summaries asked for)."""
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """The weather of a city."""
        return WEATHER.get(city, "cloudy")

    llm = ChatOpenAI(model="deepseek-flash", base_url=base_url, api_key="sk-x", max_retries=0, timeout=30,
                     **options).bind_tools([get_weather])
    messages: list[Any] = []
    for question in ("Weather in Paris? [mock:call_tool=get_weather {\"city\": \"Paris\"}]",
                     "And in Rome? [mock:call_tool=get_weather {\"city\": \"Rome\"}]"):
        messages.append(HumanMessage(question))
        for _ in range(3):  # bounded
            ai = llm.invoke(messages)
            if options.get("output_version") == "v1":
                assert [b["reasoning"] for b in ai.content if b["type"] == "reasoning"] == [REASONING]
            messages.append(ai)
            if not ai.tool_calls:
                break
            messages += [ToolMessage(get_weather.invoke(c["args"]), tool_call_id=c["id"]) for c in ai.tool_calls]
    return messages


@pytest.mark.parametrize("streaming", [False, True])
def test_langchain_agent_loop(mock, start_proxy, streaming) -> None:
    """LangChain's ChatOpenAI builds history without `reasoning_content` (it never reads it)."""
    with pytest.raises(openai.BadRequestError) as e:
        langchain_agent(mock.url, streaming=streaming)
    assert PASS_BACK in str(e.value)

    proxy = start_proxy(mock=mock)
    messages = langchain_agent(proxy.base_url, streaming=streaming)
    assert "rain, 17°C" in messages[-1].content
    assert sum(1 for m in messages if getattr(m, "tool_calls", None)) == 2
    assert [t["reasoning_content"] for t in tool_turns(mock.last_request()["body"])] == [REASONING, REASONING]


@pytest.mark.parametrize("streaming", [False, True])
def test_langchain_responses_agent_loop(mock, start_proxy, streaming) -> None:
    """LangChain's ChatOpenAI on the Responses API, asking for reasoning summaries: it shows the reasoning (as
    standard `reasoning` content blocks) and sends the reasoning items back unsealed (no `include`), so DeepSeek's
    thinking-mode tool turns get their reasoning from the continuity store."""
    proxy = start_proxy(mock=mock)
    messages = langchain_agent(proxy.base_url, streaming=streaming, use_responses_api=True,
                               reasoning={"effort": "high", "summary": "auto"}, output_version="v1")
    assert "rain, 17°C" in messages[-1].text
    assert sum(1 for m in messages if getattr(m, "tool_calls", None)) == 2
    assert [t["reasoning_content"] for t in tool_turns(mock.last_request()["body"])] == [REASONING, REASONING]


# ---------------------------------------------------------------------------------------------- R1 on MindIE

def test_r1_on_mindie_gets_no_reasoning_back_and_other_models_keep_it(start_mock, start_proxy) -> None:
    mindie = start_mock("mindie")
    proxy = start_proxy([{"name": "npu", "dialect": "mindie", "url": mindie.url,
                          "models": ["DeepSeek-R1", "Qwen3-32B"]}])
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello", "reasoning_content": "r0"},
               {"role": "user", "content": "Weather?"},
               {"role": "assistant", "content": "", "tool_calls": [call], "reasoning_content": "call it"},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    for model, kept in (("DeepSeek-R1", False), ("Qwen3-32B", True)):
        got = proxy.client().chat.completions.create(model=model, messages=history, tools=TOOLS)
        assert got.choices[0].finish_reason == "stop"
        sent = mindie.last_request()["body"]["messages"]
        assert [("reasoning_content" in m) for m in sent if m["role"] == "assistant"] == [kept, kept], model
    assert continuity_counts(proxy) == {}
