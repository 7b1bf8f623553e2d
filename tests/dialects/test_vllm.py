"""vLLM dialect, end to end: the proxy on loopback in front of the vLLM mock flavours (today's release, 0.11.1-0.15 and
0.10), driven by the openai and anthropic SDKs — reasoning field of every release, the thinking switch, tool calls
from vLLM's parsers through Chat, Responses and Messages, structured output, usage with cached tokens, /health for
readiness, vLLM's error shapes, and the probe."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml
from hub_harness import request_context
from pydantic import BaseModel

from proxy.dialects.vllm import VLLMDialect
from proxy.hub.canonical import CHAT
from proxy.probe.runner import ProbeOptions, probe
from proxy.settings import UpstreamSettings, build_settings
from tests.test_gateway import metric

REASONING = "The user greets me; 先想一想 🤔 then answer politely."
REPLY = "Hello from the mock vllm upstream! 你好, 世界 🌍."
FLAVOURS = ["", "v0.15", "v0.10"]
TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
WEATHER_ARGS = {"city": "Paris", "unit": "celsius"}


def vllm(start_mock: Any, start_proxy: Any, flavour: str = "", **kw: Any) -> tuple[Any, Any]:
    mock = start_mock("vllm", flavour=flavour, **kw)
    return mock, start_proxy(mock=mock)


def messages_client(proxy: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key="sk-client-key", max_retries=0, timeout=30)


def chat_stream(client: openai.OpenAI, **kw: Any) -> tuple[str, str, list[Any], Any]:
    """(reasoning, content, finish reasons, usage) of a streamed chat answer, as a client reads it."""
    reasoning, content, finishes, usage = "", "", [], None
    for chunk in client.chat.completions.create(stream=True, **kw):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            reasoning += extra.get("reasoning_content") or ""
            content += choice.delta.content or ""
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    return reasoning, content, finishes, usage


# ----------------------------------------------------------------------------------------------- reasoning field


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_reasoning_field_of_every_release_reaches_chat_clients_once(start_mock, start_proxy, flavour) -> None:
    """vLLM named the field `reasoning_content` (<= 0.11.0), then sent both names with the same text (0.11.1-0.15),
    then `reasoning` (0.16 on): a chat client gets the reasoning once, streamed or not."""
    mock, proxy = vllm(start_mock, start_proxy, flavour)
    client = proxy.client()
    ask = {"model": "m", "messages": [{"role": "user", "content": "Hi [mock:reasoning_field]"}]}
    reasoning, content, finishes, _ = chat_stream(client, **ask)
    assert (reasoning, content, finishes) == (REASONING, REPLY, ["stop"])
    reply = client.chat.completions.create(**ask)
    message = reply.choices[0].message
    assert (message.model_extra or {}).get("reasoning_content") == REASONING and message.content == REPLY
    assert "stream_options" not in mock.last_request()["body"]  # asked for on streams only
    if flavour == "":  # today's releases count the reasoning tokens (a reasoning parser is on)
        details = reply.usage.completion_tokens_details if reply.usage else None
        assert details is not None and details.reasoning_tokens == 12  # the reasoning's tokens, as the mock counts


@pytest.mark.parametrize("flavour", ["", "v0.15"])
@pytest.mark.parametrize("stream", [True, False])
def test_reasoning_reaches_responses_and_messages_clients(start_mock, start_proxy, flavour, stream) -> None:
    _, proxy = vllm(start_mock, start_proxy, flavour)
    ask = "Hi [mock:reasoning_field]"
    if stream:
        with proxy.client().responses.stream(model="m", input=ask, reasoning={"effort": "low"}) as events:
            final = events.get_final_response()
    else:
        final = proxy.client().responses.create(model="m", input=ask, reasoning={"effort": "low"})
    kinds = [item.type for item in final.output]
    assert kinds == ["reasoning", "message"], kinds
    reasoning = final.output[0]
    texts = [part.text for part in (reasoning.content or reasoning.summary)]  # type: ignore[union-attr]
    assert "".join(texts) == REASONING and final.output_text == REPLY
    with messages_client(proxy) as client:
        args: dict[str, Any] = {"model": "m", "max_tokens": 1024, "messages": [{"role": "user", "content": ask}],
                                "thinking": {"type": "enabled", "budget_tokens": 2048}}
        if stream:
            with client.messages.stream(**args) as events:
                message = events.get_final_message()
        else:
            message = client.messages.create(**args)
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == REASONING  # type: ignore[union-attr]
    assert message.content[1].text == REPLY  # type: ignore[union-attr]


# --------------------------------------------------------------------------------------------- the thinking switch


def test_reasoning_effort_none_switches_the_template_off(start_mock, start_proxy) -> None:
    mock, proxy = vllm(start_mock, start_proxy, "v0.10")  # a release that refuses reasoning_effort "none" itself
    client = proxy.client()
    ask = {"model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": "Hi [mock:reasoning_field]"}]}
    reply = client.chat.completions.create(reasoning_effort="none", **ask)
    sent = mock.last_request()["body"]
    assert sent["chat_template_kwargs"] == {"enable_thinking": False} and "reasoning_effort" not in sent
    assert reply.choices[0].message.content == REPLY
    assert "reasoning_content" not in (reply.choices[0].message.model_extra or {})
    reasoning, content, _, _ = chat_stream(client, reasoning_effort="high", **ask)
    sent = mock.last_request()["body"]
    assert sent["chat_template_kwargs"] == {"enable_thinking": True} and sent["reasoning_effort"] == "high"
    assert (reasoning, content) == (REASONING, REPLY)
    client.chat.completions.create(reasoning_effort="xhigh", **ask)  # type: ignore[arg-type]
    assert mock.last_request()["body"]["reasoning_effort"] == "high"  # the highest every release accepts


def test_a_clients_own_chat_template_kwargs_survive(start_mock, start_proxy) -> None:
    mock, proxy = vllm(start_mock, start_proxy)
    client = proxy.client()
    own = {"enable_thinking": True, "custom_flag": 3}
    reply = client.chat.completions.create(
        model="m", reasoning_effort="none", messages=[{"role": "user", "content": "Hi [mock:reasoning_field]"}],
        extra_body={"chat_template_kwargs": own, "top_k": 20})
    sent = mock.last_request()["body"]
    assert sent["chat_template_kwargs"] == own and sent["top_k"] == 20  # the client's own switch wins
    assert (reply.choices[0].message.model_extra or {}).get("reasoning_content") == REASONING
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}],
                                   extra_body={"thinking": {"type": "disabled"}})
    sent = mock.last_request()["body"]
    assert sent["chat_template_kwargs"] == {"enable_thinking": False} and "thinking" not in sent
    with messages_client(proxy) as messages:
        messages.messages.create(model="m", max_tokens=64, messages=[{"role": "user", "content": "Hi"}],
                                 thinking={"type": "disabled"})
    assert mock.last_request()["body"]["chat_template_kwargs"] == {"enable_thinking": False}


def test_deepseek_templates_get_their_own_kwarg_and_completions_none() -> None:
    spoke = VLLMDialect()
    up = UpstreamSettings(name="v", dialect="vllm", url="http://127.0.0.1:9")
    ctx = request_context(CHAT, "deepseek-ai/DeepSeek-V3.1", up, stream=True, include_usage=False,
                          response_id="chatcmpl-t", created=1)
    out = spoke.build_request({"model": "x", "messages": [], "reasoning_effort": "minimal",
                               "stream_options": {"continuous_usage_stats": True}}, ctx)
    assert out["chat_template_kwargs"] == {"thinking": False} and "reasoning_effort" not in out
    assert out["stream_options"] == {"include_usage": True}
    out = spoke.build_request({"model": "x", "messages": [], "reasoning_effort": "max"}, ctx)
    assert out["chat_template_kwargs"] == {"thinking": True} and out["reasoning_effort"] == "high"


# ------------------------------------------------------------------------------------------------------ tool calls


@pytest.mark.parametrize("stream", [True, False])
def test_tool_calls_of_the_hermes_parser(start_mock, start_proxy, stream) -> None:
    """vLLM streams a call's id and name first, then argument pieces, the last one on the finish chunk."""
    _, proxy = vllm(start_mock, start_proxy)
    client = proxy.client()
    ask = {"model": "m", "tools": [TOOL], "messages": [{"role": "user", "content": "Weather? [mock:tool_calls=2]"}]}
    if stream:
        calls: dict[int, dict[str, str]] = {}
        finishes = []
        for chunk in client.chat.completions.create(stream=True, **ask):
            for choice in chunk.choices:
                for tc in choice.delta.tool_calls or ():
                    call = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                    call["id"] += tc.id or ""
                    call["name"] += (tc.function and tc.function.name) or ""
                    call["arguments"] += (tc.function and tc.function.arguments) or ""
                if choice.finish_reason:
                    finishes.append(choice.finish_reason)
        got = [calls[i] for i in sorted(calls)]
    else:
        reply = client.chat.completions.create(**ask)
        finishes = [reply.choices[0].finish_reason]
        assert reply.choices[0].message.content is None
        got = [{"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments}  # type: ignore[union-attr]
               for tc in reply.choices[0].message.tool_calls or ()]
    assert finishes == ["tool_calls"]
    assert [c["name"] for c in got] == ["get_weather", "get_weather"]
    assert all(json.loads(c["arguments"]) == WEATHER_ARGS for c in got)
    assert all(c["id"].startswith("chatcmpl-tool-") for c in got) and got[0]["id"] != got[1]["id"]


def test_a_named_tool_choice_finishes_with_stop_as_vllm_says(start_mock, start_proxy) -> None:
    _, proxy = vllm(start_mock, start_proxy)
    reply = proxy.client().chat.completions.create(
        model="m", tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}},
        messages=[{"role": "user", "content": "Weather in Paris?"}])
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.content
    assert choice.message.tool_calls and choice.message.tool_calls[0].function.name == "get_weather"  # type: ignore[union-attr]


def test_tool_loops_through_responses_and_messages(start_mock, start_proxy) -> None:
    _, proxy = vllm(start_mock, start_proxy)
    tool = {"type": "function", "name": "get_weather", "description": "Weather.", "strict": False,
            "parameters": TOOL["function"]["parameters"]}  # type: ignore[index]
    client = proxy.client()
    first = client.responses.create(model="m", tools=[tool], input="Weather? [mock:call_tool]")  # type: ignore[list-item]
    call = next(item for item in first.output if item.type == "function_call")
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    second = client.responses.create(model="m", tools=[tool], previous_response_id=first.id,  # type: ignore[list-item]
                                     input=[{"type": "function_call_output", "call_id": call.call_id,
                                             "output": "sunny"}])
    assert second.output_text == "Tool get_weather returned: sunny"
    with messages_client(proxy) as messages:
        spec = {"name": "get_weather", "description": "Weather.", "input_schema": TOOL["function"]["parameters"]}  # type: ignore[index]
        ask = [{"role": "user", "content": "Weather? [mock:call_tool]"}]
        with messages.messages.stream(model="m", max_tokens=256, tools=[spec], messages=ask) as events:  # type: ignore[arg-type]
            turn = events.get_final_message()
        assert turn.stop_reason == "tool_use"
        use = next(block for block in turn.content if block.type == "tool_use")
        assert use.name == "get_weather" and use.input == {"city": "Paris"}
        ask += [{"role": "assistant", "content": [block.model_dump() for block in turn.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}]
        done = messages.messages.create(model="m", max_tokens=256, tools=[spec], messages=ask)  # type: ignore[arg-type]
    assert done.stop_reason == "end_turn" and done.content[0].text == "Tool get_weather returned: sunny"  # type: ignore[union-attr]


# ------------------------------------------------------------------------------------------------ structured output


class Answer(BaseModel):
    city: str
    days: int


def test_structured_output_passes_and_vllms_refusal_is_the_clients_400(start_mock, start_proxy) -> None:
    mock, proxy = vllm(start_mock, start_proxy)
    client = proxy.client()
    parsed = client.chat.completions.parse(model="m", response_format=Answer,
                                           messages=[{"role": "user", "content": "Plan a trip."}])
    assert parsed.choices[0].message.parsed == Answer(city="Paris", days=1)
    assert mock.last_request()["body"]["response_format"]["type"] == "json_schema"
    obj = client.chat.completions.create(model="m", response_format={"type": "json_object"},
                                         messages=[{"role": "user", "content": "JSON please"}])
    assert isinstance(json.loads(obj.choices[0].message.content or ""), dict)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="m", response_format={"type": "json_schema"},  # type: ignore[typeddict-item]
                                       messages=[{"role": "user", "content": "JSON please"}])
    assert "'json_schema' field must be provided" in caught.value.message
    assert caught.value.body["param"] == "response_format"  # type: ignore[index]


# ---------------------------------------------------------------------------------------- usage with cached tokens


def test_cached_tokens_reach_every_client_exactly(start_mock, start_proxy) -> None:
    mock, proxy = vllm(start_mock, start_proxy)
    client = proxy.client()
    question = "Hi [mock:cached=16] " + "and so on " * 20  # a prompt longer than one cache block
    ask = [{"role": "user", "content": question}]
    reply = client.chat.completions.create(model="m", messages=ask)  # type: ignore[arg-type]
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 16 and usage.completion_tokens == 13
    prompt = usage.prompt_tokens
    _, _, _, streamed = chat_stream(client, model="m", messages=ask,
                                    stream_options={"include_usage": True, "continuous_usage_stats": True})
    assert streamed.prompt_tokens_details.cached_tokens == 16
    assert (streamed.prompt_tokens, streamed.completion_tokens, streamed.total_tokens) == (prompt, 13, prompt + 13)
    assert mock.last_request()["body"]["stream_options"] == {"include_usage": True}
    response = client.responses.create(model="m", input=question)
    assert response.usage is not None and response.usage.input_tokens_details.cached_tokens == 16
    assert response.usage.output_tokens == 13
    with messages_client(proxy) as messages:
        message = messages.messages.create(model="m", max_tokens=64, messages=[{"role": "user", "content": question}])
    assert message.usage.cache_read_input_tokens == 16 and message.usage.output_tokens == 13
    assert message.usage.input_tokens == response.usage.input_tokens - 16


# ---------------------------------------------------------------------------------------------------- readiness


def test_readiness_asks_vllms_health_endpoint(start_mock, start_proxy) -> None:
    mock, proxy = vllm(start_mock, start_proxy)
    with httpx.Client(base_url=proxy.url, timeout=10) as web:
        ready = web.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert "the vllm health path GET /health answered HTTP 200" in ready.json()["checks"]["mock-vllm"]["reason"]
    sick = start_mock("vllm", directives="unhealthy")
    with httpx.Client(base_url=start_proxy(mock=sick).url, timeout=10) as web:
        answer = web.get("/readyz")
    assert answer.status_code == 503
    assert "GET /health answered HTTP 503" in answer.json()["checks"]["mock-vllm"]["reason"]
    assert mock.stats()["requests"] == 0  # neither the health path nor the check counts as a client's request


# ------------------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("flavour", ["", "v0.10"])
def test_vllms_error_shapes_become_the_clients_own(start_mock, start_proxy, flavour) -> None:
    """The nested `{"error": {..., "code": 400}}` (0.10.1 on) and the flat `{"object": "error", ...}` before it."""
    _, proxy = vllm(start_mock, start_proxy, flavour, served_model="Qwen/Qwen3-8B")
    client = proxy.client()
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="Qwen/Qwen3-8B", messages=[{"role": "user", "content": "Hi"}],
                                       stream_options={"include_usage": True})  # without stream: vLLM refuses
    assert bad.value.body["message"] == "Stream options can only be defined when `stream=True`."  # type: ignore[index]
    assert bad.value.body["param"] == "stream_options"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="Qwen/Qwen3-32B", messages=[{"role": "user", "content": "Hi"}],
                                       stream=True)
    assert missing.value.body["code"] == "model_not_found"  # type: ignore[index]
    assert "The model `Qwen/Qwen3-32B` does not exist." in missing.value.message
    with pytest.raises(openai.InternalServerError) as failed:
        client.chat.completions.create(model="Qwen/Qwen3-8B",
                                       messages=[{"role": "user", "content": "[mock:error=500]"}])
    assert failed.value.status_code == 502 and "mock directive error=500" in failed.value.message
    with messages_client(proxy) as messages, pytest.raises(anthropic.BadRequestError) as refused:
        messages.messages.create(model="Qwen/Qwen3-8B", max_tokens=64,
                                 messages=[{"role": "user", "content": "[mock:error=400]"}])
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


# --------------------------------------------------------------------------------------------------------- probe


def test_the_probe_knows_a_vllm_server(start_mock) -> None:
    mock = start_mock("vllm")
    report = asyncio.run(probe(ProbeOptions(url=mock.url + "/v1", timeout=10)))
    assert report.dialect == "vllm" and report.dialect_evidence == ["vLLM model list (owned_by: vllm)"]
    assert report.models == ["Qwen/Qwen3-8B"] and report.chat == "ok" and not report.problems
    assert (report.usage, report.tool_calls) == ("final_chunk", "streamed")
    config = yaml.safe_load(report.config)
    assert config["upstreams"][0] == {"name": "vllm", "dialect": "vllm", "url": mock.url}
    assert "--enable-prompt-tokens-details" in report.config
    assert build_settings(config=config, environ={}).upstreams[0].dialect == "vllm"


def test_native_passthrough_to_vllms_responses_and_messages_routes(start_mock, start_proxy) -> None:
    """`passthrough: [responses, messages]` on a vLLM upstream: both go to vLLM's own routes untranslated (fields the
    proxy would not produce arrive, the upstream key as a Bearer token), and usage is still counted."""
    mock = start_mock("vllm", api_key="sk-vllm-upstream")
    proxy = start_proxy([{"name": "v", "dialect": "vllm", "url": mock.url, "api_key_env": "VKEY",
                          "passthrough": ["responses", "messages"]}], environ={"VKEY": "sk-vllm-upstream"})
    answer = proxy.client().responses.create(model="m", input="hi [mock:cached=2]",
                                             extra_body={"x_vllm_extra": {"kept": True}})
    sent = mock.last_request()
    assert sent["path"] == "/v1/responses" and sent["body"]["x_vllm_extra"] == {"kept": True}
    assert sent["headers"]["authorization"] == "Bearer sk-vllm-upstream"
    assert answer.output_text.startswith("Hello from the mock") and answer.usage.input_tokens_details.cached_tokens == 2
    with messages_client(proxy).messages.stream(model="m", max_tokens=64,
                                                messages=[{"role": "user", "content": "hi"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert mock.last_request()["path"] == "/v1/messages"
    assert text.startswith("Hello from the mock") and final.stop_reason == "end_turn"
    assert metric(proxy, "dialect_proxy_tokens_total", upstream="v", kind="cached") == 2
    assert metric(proxy, "dialect_proxy_tokens_total", upstream="v", kind="completion") == \
        answer.usage.output_tokens + final.usage.output_tokens
