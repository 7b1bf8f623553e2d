"""Anthropic Messages request -> canonical chat request (proxy/clients/messages.py), and its two helpers: the
thinking signature (proxy/clients/signature.py) and the reversible tool-call ids (proxy/clients/tool_ids.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.clients import tool_ids
from proxy.clients.base import ClientCall
from proxy.clients.messages import MessagesClient, count_tokens, decode_request
from proxy.clients.signature import ThinkingSigner
from proxy.errors import ClientRequestError
from proxy.settings import build_settings
from proxy.state import open_store

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "clients"
SIGNER = ThinkingSigner(b"k" * 32)
WEATHER = {"name": "get_weather", "description": "Weather", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def decode(body: dict[str, Any], signer: ThinkingSigner = SIGNER) -> ClientCall:
    return decode_request({"model": "m", "max_tokens": 64, **body}, signer)


def msgs(call: ClientCall) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = call.request["messages"]
    return result


def walk_keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in walk_keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in walk_keys(v)}
    return set()


def test_plain_request_maps_fields_and_ignores_unknown_ones():
    call = decode({"system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
                              {"type": "text", "text": "Be kind."}],
                   "messages": [{"role": "user", "content": [{"type": "text", "text": "hi",
                                                              "cache_control": {"type": "ephemeral"}}]}],
                   "stop_sequences": ["END"], "temperature": 0.2, "top_p": 0.9, "top_k": 5,
                   "metadata": {"user_id": "u-1"}, "context_management": {"edits": []}, "service_tier": "auto",
                   "some_future_field": {"x": 1}})
    req = call.request
    assert msgs(call) == [{"role": "system", "content": "Be brief.\n\nBe kind."},
                          {"role": "user", "content": "hi"}]
    assert req["max_completion_tokens"] == 64 and req["stop"] == ["END"] and req["user"] == "u-1"
    assert (req["temperature"], req["top_p"], req["top_k"]) == (0.2, 0.9, 5)
    assert req["stream"] is False and "stream_options" not in req and "reasoning_effort" not in req
    assert not walk_keys(req) & {"cache_control", "context_management", "some_future_field", "service_tier"}
    assert call.model == "m" and call.kind == "chat" and not call.stream


def test_stream_asks_for_usage():
    call = decode({"stream": True, "messages": [{"role": "user", "content": "hi"}]})
    assert call.stream and call.request["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
    ({"max_tokens": 0, "model": "m", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}, "model"),
    ({"max_tokens": 5, "model": "m", "messages": []}, "messages"),
    ({"max_tokens": 5, "model": "m", "messages": [{"role": "bot", "content": "hi"}]}, "messages"),
    ({"max_tokens": 5, "model": "m", "messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages"),
    ({"max_tokens": 5, "model": "m", "messages": [{"role": "user", "content": "x"}], "thinking": {"type": "on"}},
     "thinking"),
    ({"max_tokens": 5, "model": "m", "messages": [{"role": "user", "content": "x"}],
      "tool_choice": {"type": "tool", "name": "nope"}, "tools": [WEATHER]}, "tool_choice"),
])
def test_what_the_client_got_wrong_is_a_400_naming_the_parameter(body: dict[str, Any], param: str):
    with pytest.raises(ClientRequestError) as info:
        decode_request(body, SIGNER)
    assert info.value.status == 400 and info.value.param == param


def test_system_messages_inside_messages():
    call = decode({"system": "S0", "messages": [
        {"role": "system", "content": "S1"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "system", "content": [{"type": "text", "text": "late"}]},
        {"role": "user", "content": "q2"},
    ]})
    out = msgs(call)
    assert out[0] == {"role": "system", "content": "S0\n\nS1"}
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[3]["content"] == [{"type": "text", "text": "<system-reminder>\nlate\n</system-reminder>"},
                                 {"type": "text", "text": "q2"}]


def test_images_base64_and_url():
    call = decode({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.invalid/a.png"}},
        {"type": "text", "text": "what is this?"},
    ]}]})
    assert msgs(call)[0]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
        {"type": "image_url", "image_url": {"url": "https://example.invalid/a.png"}},
        {"type": "text", "text": "what is this?"},
    ]


def test_tool_use_and_tool_result_carry_the_upstreams_own_ids():
    call = decode({"tools": [WEATHER], "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
                   "messages": [
                       {"role": "user", "content": "weather?"},
                       {"role": "assistant", "content": [
                           {"type": "text", "text": "Looking."},
                           {"type": "tool_use", "id": "toolu_call_abc", "name": "get_weather",
                            "input": {"city": "Paris"}},
                           {"type": "tool_use", "id": "toolu_rec1", "name": "get_weather", "input": {"city": "Oslo"}},
                       ]},
                       {"role": "user", "content": [
                           {"type": "tool_result", "tool_use_id": "toolu_call_abc", "content": "sunny",
                            "cache_control": {"type": "ephemeral"}},
                           {"type": "tool_result", "tool_use_id": "toolu_rec1", "is_error": True,
                            "content": [{"type": "text", "text": "no such city"}]},
                           {"type": "text", "text": "and now?"},
                       ]},
                   ]})
    req = call.request
    assert req["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "parameters": WEATHER["input_schema"], "description": "Weather"}}]
    assert req["tool_choice"] == "required" and req["parallel_tool_calls"] is False
    out = msgs(call)
    assert out[1] == {"role": "assistant", "content": "Looking.", "tool_calls": [
        {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
        {"id": "rec1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}},
    ]}
    assert out[2] == {"role": "tool", "tool_call_id": "call_abc", "content": "sunny"}
    assert out[3] == {"role": "tool", "tool_call_id": "rec1", "content": "Error: no such city"}
    assert out[4] == {"role": "user", "content": "and now?"}


@pytest.mark.parametrize(("choice", "expected"), [
    ({"type": "auto"}, "auto"), ({"type": "none"}, "none"),
    ({"type": "tool", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}}),
])
def test_tool_choice(choice: dict[str, Any], expected: Any):
    call = decode({"tools": [WEATHER], "tool_choice": choice, "messages": [{"role": "user", "content": "x"}]})
    assert call.request["tool_choice"] == expected and "parallel_tool_calls" not in call.request


@pytest.mark.parametrize(("body", "effort"), [
    ({}, None),
    ({"thinking": {"type": "disabled"}}, "none"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "low"),
    ({"thinking": {"type": "enabled", "budget_tokens": 8000}}, "medium"),
    ({"thinking": {"type": "enabled", "budget_tokens": 31999}}, "high"),
    ({"thinking": {"type": "adaptive"}}, "high"),
    ({"thinking": {"type": "adaptive", "display": "omitted"}, "output_config": {"effort": "low"}}, "low"),
    ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}}, "xhigh"),
    ({"output_config": {"effort": "medium"}}, "medium"),
])
def test_thinking_switch_becomes_reasoning_effort(body: dict[str, Any], effort: str | None):
    call = decode({**body, "messages": [{"role": "user", "content": "x"}]})
    assert call.request.get("reasoning_effort") == effort
    assert "thinking" not in call.request and "chat_template_kwargs" not in call.request


def _assistant_with(thinking: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [thinking, {"type": "tool_use", "id": "toolu_call_1", "name": "f",
                                                     "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_call_1", "content": "ok"}]},
    ]}


def test_thinking_signed_by_this_proxy_is_replayed_as_reasoning():
    text = "I should call f. 先想一想"
    block = {"type": "thinking", "thinking": text, "signature": SIGNER.sign_text(text)}
    call = decode(_assistant_with(block))
    assert msgs(call)[1]["reasoning_content"] == text
    assert call.log_note is None


def test_omitted_thinking_comes_back_from_its_signature():
    text = "hidden reasoning"
    block = {"type": "thinking", "thinking": "", "signature": SIGNER.sign_text(text, carry=True)}
    assert msgs(decode(_assistant_with(block)))[1]["reasoning_content"] == text


@pytest.mark.parametrize("block", [
    {"type": "thinking", "thinking": "made up", "signature": "c2lnbmF0dXJl"},  # another server's (Claude Code capture)
    {"type": "thinking", "thinking": "made up"},
    {"type": "thinking", "thinking": "altered", "signature": SIGNER.sign_text("original")},
    {"type": "thinking", "thinking": "other key", "signature": ThinkingSigner(b"x" * 32).sign_text("other key")},
    {"type": "redacted_thinking", "data": "EmwKAhgB"},
])
def test_thinking_the_proxy_did_not_produce_is_never_sent_as_reasoning(block: dict[str, Any]):
    call = decode(_assistant_with(block))
    assistant = msgs(call)[1]
    assert "reasoning_content" not in assistant and "reasoning" not in assistant
    assert assistant["tool_calls"][0]["id"] == "call_1"
    if block["type"] == "thinking":
        assert call.log_note == ("unverified_thinking", 1)


def test_signer_key_from_settings_verifies_across_instances():
    settings = build_settings(config={"upstreams": [{"name": "u", "dialect": "openai", "url": "http://127.0.0.1:9"}],
                                      "client": {"thinking_key_env": "TK"}}, environ={"TK": "secret"})
    a, b = (MessagesClient(settings, open_store(settings)) for _ in range(2))
    signature = a.signer.sign_text("r")
    assert b.signer.open("r", signature) == ("r", True)
    unset = build_settings(config={"upstreams": [{"name": "u", "dialect": "openai", "url": "http://127.0.0.1:9"}]},
                           environ={})
    c, d = (MessagesClient(unset, open_store(unset)) for _ in range(2))
    # without a key: one random key per process (the compaction endpoint's seals verify on /v1/responses), which
    # another process (another key) does not share
    assert c.signer.open("r", d.signer.sign_text("r")) == ("r", True)
    assert c.signer.open("r", ThinkingSigner(b"another process").sign_text("r")) == ("r", False)


@given(st.text(min_size=1, max_size=40))
def test_tool_ids_round_trip(upstream_id: str):
    client_id = tool_ids.to_client(upstream_id)
    assert client_id.startswith("toolu_")
    assert all(ch.isascii() and (ch.isalnum() or ch in "_-") for ch in client_id)
    assert tool_ids.to_upstream(client_id) == upstream_id


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("claude-code-*.json")))
def test_claude_code_captures_decode(name: str):
    body = json.loads((FIXTURES / name).read_text())["body"]
    call = decode_request(body, SIGNER)
    req = call.request
    assert call.stream and req["max_completion_tokens"] == body["max_tokens"]
    assert req["reasoning_effort"] in ("high", "xhigh")
    assert "cache_control" not in walk_keys(req) and "context_management" not in req
    names = {t["function"]["name"] for t in req["tools"]}
    assert {"Bash", "Read"} <= names
    roles = [m["role"] for m in req["messages"]]
    assert roles[0] == "system" and "system" not in roles[1:]
    for m in req["messages"]:
        assert "reasoning_content" not in m  # the captures' thinking carries another server's signature
    tool_msgs = [m for m in req["messages"] if m["role"] == "tool"]
    calls = [c for m in req["messages"] for c in m.get("tool_calls", ())]
    assert [m["tool_call_id"] for m in tool_msgs] == [c["id"] for c in calls]


def test_count_tokens_grows_with_the_request_and_needs_no_max_tokens():
    small = count_tokens({"model": "m", "messages": [{"role": "user", "content": "hi"}]})["input_tokens"]
    big = count_tokens({"model": "m", "messages": [{"role": "user", "content": "hi " * 400}],
                        "tools": [WEATHER]})["input_tokens"]
    cjk = count_tokens({"model": "m", "messages": [{"role": "user", "content": "你好世界" * 50}]})["input_tokens"]
    assert 0 < small < big and cjk >= 200
    with pytest.raises(ClientRequestError):
        count_tokens({"model": "m"})


def test_decode_is_the_client_spokes_entry():
    settings = build_settings(config={"upstreams": [{"name": "u", "dialect": "openai", "url": "http://127.0.0.1:9"}]},
                              environ={})
    client = MessagesClient(settings, open_store(settings))
    call = asyncio.run(client.decode({"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "x"}]}))
    assert call.request["messages"] == [{"role": "user", "content": "x"}]


def test_thinking_key_env_must_be_set():
    from proxy.settings import ConfigError

    with pytest.raises(ConfigError, match="client.thinking_key_env"):
        build_settings(config={"upstreams": [{"name": "u", "dialect": "openai", "url": "http://127.0.0.1:9"}],
                               "client": {"thinking_key_env": "TK"}}, environ={})
