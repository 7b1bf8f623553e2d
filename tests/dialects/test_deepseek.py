"""DeepSeek dialect: request mapping (replay, R1 rules, thinking, bounds, prefix) and decoding of golden transcripts."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hub_harness import Run, complete, request_context
from hub_harness import relay as hub_relay

from proxy.clients.chat import chat_encoder
from proxy.dialects.deepseek import DeepSeekDialect, merge_successive
from proxy.errors import ClientRequestError, StreamTruncated, UpstreamError
from proxy.hub.canonical import CHAT, COMPLETIONS, RequestContext
from proxy.hub.events import Answer
from proxy.hub.normalize import Normalizer
from proxy.hub.sse import SSEDecoder, encode_events
from proxy.settings import ClientSettings, UpstreamSettings

FIXTURES = Path(__file__).parent.parent / "fixtures" / "deepseek"
DS = DeepSeekDialect()
TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
MSG = [{"role": "user", "content": "q"}]
# The documented placeholder for a thinking-mode tool-call turn without reasoning (docs/deepseek.md).
PLACEHOLDER = "(reasoning not available)"


def ctx(
    model: str = "deepseek-chat",
    *,
    kind: str = CHAT,
    stream: bool = False,
    include_usage: bool = False,
    url: str = "http://127.0.0.1:9",
    **upstream: Any,
) -> RequestContext:
    up = UpstreamSettings(name="ds", dialect="deepseek", url=url, **upstream)
    return request_context(
        kind, model, up, stream=stream, include_usage=include_usage, response_id="chatcmpl-test", created=1
    )


def build(body: dict[str, Any], c: RequestContext | None = None) -> dict[str, Any]:
    c = c or ctx(body.get("model", "deepseek-chat"), stream=body.get("stream") is True)
    before = copy.deepcopy(body)
    out = DS.build_request(body, c)
    assert body == before, "build_request must not mutate the client's body"
    return out


def relay(
    raw: bytes, c: RequestContext, cut: int | None = None, client: ClientSettings | None = None, dialect: Any = DS
) -> tuple[list[dict[str, Any]], Run]:
    """Upstream bytes (cut in two at `cut`) -> the proxy's own pipeline and chat encoder -> client chunks."""
    return hub_relay([raw] if cut is None else [raw[:cut], raw[cut:]], c, dialect, client)


def texts(chunks: list[dict[str, Any]], key: str) -> str:
    return "".join(ch["delta"].get(key) or "" for c in chunks for ch in c["choices"])


# ----------------------------------------------------------------------------------------------- reasoning replay


def history(assistant: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "q1"}, assistant, {"role": "user", "content": "q2"}]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_auto_replay_strips_reasoning_on_turns_without_tool_calls(field: str) -> None:
    out = build(
        {"model": "deepseek-reasoner", "messages": history({"role": "assistant", "content": "a1", field: "thought"})}
    )
    assert out["messages"][1] == {"role": "assistant", "content": "a1"}


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_auto_replay_keeps_reasoning_on_tool_call_turns_as_reasoning_content(field: str) -> None:
    msgs = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL], field: "need a tool"},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    out = build({"model": "deepseek-chat", "messages": msgs, "thinking": {"type": "enabled"}})
    assert out["messages"][1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [TOOL_CALL],
        "reasoning_content": "need a tool",
    }
    assert "reasoning" not in out["messages"][1]


def test_replay_override_strip_and_keep() -> None:
    msgs = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL], "reasoning_content": "r1"},
        {"role": "tool", "tool_call_id": "call_1", "content": "x"},
        {"role": "assistant", "content": "a", "reasoning": "r2"},
        {"role": "user", "content": "q2"},
    ]
    strip = build({"model": "deepseek-reasoner", "messages": msgs}, ctx("deepseek-reasoner", reasoning_replay="strip"))
    assert all("reasoning_content" not in m and "reasoning" not in m for m in strip["messages"])
    keep = build({"model": "deepseek-chat", "messages": msgs}, ctx(reasoning_replay="keep"))
    assert [m.get("reasoning_content") for m in keep["messages"]] == [None, "r1", None, "r2", None]
    assert all("reasoning" not in m for m in keep["messages"])


def test_think_tags_round_tripped_in_content_become_the_reasoning_field() -> None:
    msgs = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<think>plan a call</think>\n\n", "tool_calls": [TOOL_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "x"},
        {"role": "assistant", "content": "  <think>why</think>\n\nThe answer."},
        {"role": "user", "content": "q2"},
    ]
    out = build({"model": "deepseek-chat", "messages": msgs, "thinking": {"type": "enabled"}})
    assert out["messages"][1]["reasoning_content"] == "plan a call"
    assert out["messages"][1]["content"] == ""
    assert out["messages"][3] == {"role": "assistant", "content": "The answer."}


def test_thinking_tool_turn_without_any_reasoning_gets_the_placeholder() -> None:
    msgs = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "x"},
    ]
    out = build({"model": "deepseek-chat", "messages": msgs, "thinking": {"type": "enabled"}})
    assert out["messages"][1]["reasoning_content"] == PLACEHOLDER
    # an empty reasoning counts as none (reports differ on whether DeepSeek accepts it)
    empty = [msgs[0], {**msgs[1], "reasoning_content": ""}, msgs[2]]
    out = build({"model": "deepseek-flash", "messages": empty}, ctx("deepseek-flash", reasoning_replay="keep"))
    assert out["messages"][1]["reasoning_content"] == PLACEHOLDER
    # Not in non-thinking requests (nothing requires it there).
    out = build({"model": "deepseek-chat", "messages": msgs})
    assert "reasoning_content" not in out["messages"][1]


def test_prefix_continuation_keeps_its_reasoning_and_goes_to_beta() -> None:
    msgs = [
        {"role": "user", "content": "Write a poem"},
        {"role": "assistant", "content": "Roses", "reasoning_content": "a poem", "prefix": True},
    ]
    c = ctx("deepseek-reasoner")
    out = build({"model": "deepseek-reasoner", "messages": msgs}, c)
    assert out["messages"][1] == msgs[1]
    assert DS.request_path("/chat/completions", out, c) == "/beta/chat/completions"
    assert DS.request_path("/chat/completions", out, ctx(url="http://h/beta")) == "/chat/completions"
    plain = build({"model": "deepseek-chat", "messages": msgs[:1]})
    assert DS.request_path("/chat/completions", plain, c) == "/chat/completions"
    fim = ctx(kind=COMPLETIONS)
    assert DS.request_path(DS.path(COMPLETIONS) or "", {"prompt": "x"}, fim) == "/beta/completions"


# ----------------------------------------------------------------------------------------------------- R1 rules


def test_r1_merges_successive_same_role_messages() -> None:
    msgs = [
        {"role": "system", "content": "s1"},
        {"role": "system", "content": "s2"},
        {"role": "user", "content": "u1"},
        {"role": "user", "content": [{"type": "text", "text": "u2"}]},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]},
        {"role": "assistant", "content": "a1", "reasoning_content": "r"},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "u3"},
    ]
    out = build({"model": "deepseek-r1", "messages": msgs})
    assert out["messages"] == [
        {"role": "system", "content": "s1\n\ns2"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "u1\n\nu2"}, {"type": "image_url", "image_url": {"url": "data:,"}}],
        },
        {"role": "assistant", "content": "a1\n\na2"},
        {"role": "user", "content": "u3"},
    ]
    # Non-R1 models keep the client's messages as they are.
    assert len(build({"model": "deepseek-chat", "messages": msgs})["messages"]) == len(msgs)


def test_developer_role_and_text_parts_become_deepseek_messages() -> None:
    msgs = [
        {"role": "developer", "content": [{"type": "text", "text": "Be"}, {"type": "text", "text": "brief"}]},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ]
    out = build({"model": "deepseek-chat", "messages": msgs})
    assert out["messages"] == [{"role": "system", "content": "Be\nbrief"}, {"role": "user", "content": "hi"}]


def test_merge_keeps_tool_messages_apart_and_joins_tool_calls() -> None:
    msgs = [
        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
        {"role": "assistant", "content": None, "tool_calls": [{**TOOL_CALL, "id": "call_2"}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a"},
        {"role": "tool", "tool_call_id": "call_2", "content": "b"},
    ]
    merged = merge_successive(msgs)
    assert len(merged) == 3
    assert [c["id"] for c in merged[0]["tool_calls"]] == ["call_1", "call_2"]
    assert merged[0]["content"] is None


@pytest.mark.parametrize("extra", [{"logprobs": True}, {"logprobs": True, "top_logprobs": 3}, {"top_logprobs": 0}])
def test_r1_refuses_logprobs_clearly(extra: dict[str, Any]) -> None:
    with pytest.raises(ClientRequestError) as e:
        build({"model": "DeepSeek-R1", "messages": [{"role": "user", "content": "q"}], **extra})
    assert e.value.status == 400 and e.value.param in ("logprobs", "top_logprobs")
    assert "DeepSeek-R1" in e.value.message
    out = build({"model": "DeepSeek-R1", "messages": [{"role": "user", "content": "q"}], "logprobs": False})
    assert "logprobs" not in out
    out = build(
        {"model": "deepseek-chat", "messages": [{"role": "user", "content": "q"}], "logprobs": True, "top_logprobs": 3}
    )
    assert out["logprobs"] is True and out["top_logprobs"] == 3


# ---------------------------------------------------------------------------------------------------- thinking


@pytest.mark.parametrize(
    ("effort", "sent"),
    [("minimal", "low"), ("low", "low"), ("medium", "high"), ("high", "high"), ("xhigh", "max"), ("max", "max")],
)
def test_reasoning_effort_maps_to_deepseek_levels(effort: str, sent: str) -> None:
    out = build({"model": "deepseek-v4-pro", "messages": MSG, "reasoning_effort": effort})
    assert out["reasoning_effort"] == sent and out["thinking"] == {"type": "enabled"}


def test_reasoning_effort_none_switches_thinking_off() -> None:
    out = build({"model": "deepseek-flash", "messages": MSG, "reasoning_effort": "none"})
    assert out["thinking"] == {"type": "disabled"} and "reasoning_effort" not in out


def test_thinking_is_deepseeks_default_and_retired_names_are_v4_flash_modes() -> None:
    out = build({"model": "deepseek-flash", "messages": MSG})
    assert "thinking" not in out and out["model"] == "deepseek-flash"  # DeepSeek's default: enabled
    chat = build({"model": "deepseek-chat", "messages": MSG})
    assert chat["model"] == "deepseek-v4-flash" and chat["thinking"] == {"type": "disabled"}
    reasoner = build({"model": "deepseek-reasoner", "messages": MSG, "reasoning_effort": "xhigh"})
    assert reasoner["model"] == "deepseek-v4-flash" and reasoner["thinking"] == {"type": "enabled"}
    assert reasoner["reasoning_effort"] == "max"
    # An explicit switch wins over the retired name's mode.
    on = build({"model": "deepseek-chat", "messages": MSG, "thinking": {"type": "enabled"}})
    assert on["model"] == "deepseek-v4-flash" and on["thinking"] == {"type": "enabled"}


def test_replay_mode_per_model() -> None:
    assert DS.reasoning_replay({"messages": MSG}, ctx("deepseek-flash")) == "restore"
    assert DS.reasoning_replay({"messages": MSG}, ctx("deepseek-reasoner")) == "restore"
    assert DS.reasoning_replay({"messages": MSG}, ctx("deepseek-chat")) == "keep"  # non-thinking: nothing needed
    assert DS.reasoning_replay({"messages": MSG, "thinking": {"type": "disabled"}}, ctx("deepseek-v4-pro")) == "keep"
    assert DS.reasoning_replay({"messages": MSG}, ctx("DeepSeek-R1")) == "strip"
    assert DS.reasoning_replay({"messages": MSG}, ctx("deepseek-r1", reasoning_replay="keep")) == "keep"
    assert DS.reasoning_replay({"messages": MSG}, ctx("deepseek-flash", reasoning_replay="strip")) == "strip"


def test_explicit_thinking_wins_and_r1_gets_no_switch() -> None:
    out = build(
        {
            "model": "deepseek-chat",
            "messages": [{"role": "user", "content": "q"}],
            "reasoning_effort": "high",
            "thinking": {"type": "disabled"},
        }
    )
    assert out["thinking"] == {"type": "disabled"}
    assert "reasoning_effort" not in out
    out = build({"model": "deepseek-r1", "messages": [{"role": "user", "content": "q"}], "reasoning_effort": "high"})
    assert "thinking" not in out and "reasoning_effort" not in out


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_choice_disables_thinking(choice: Any) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    out = build(
        {
            "model": "deepseek-chat",
            "messages": [{"role": "user", "content": "q"}],
            "tools": tools,
            "tool_choice": choice,
            "thinking": {"type": "enabled"},
        }
    )
    assert out["thinking"] == {"type": "disabled"} and out["tool_choice"] == choice
    out = build(
        {
            "model": "deepseek-chat",
            "messages": [{"role": "user", "content": "q"}],
            "tools": tools,
            "tool_choice": "auto",
            "thinking": {"type": "enabled"},
        }
    )
    assert out["thinking"] == {"type": "enabled"}
    # Thinking is on by default: a forced call without a switch says `disabled` too.
    out = build({"model": "deepseek-flash", "messages": MSG, "tools": tools, "tool_choice": choice})
    assert out["thinking"] == {"type": "disabled"}


# ------------------------------------------------------------------------------------------- parameter bounds


def test_max_tokens_bounds() -> None:
    assert build({"model": "deepseek-chat", "messages": MSG, "max_tokens": 16000})["max_tokens"] == 16000
    assert build({"model": "deepseek-chat", "messages": MSG, "max_tokens": 400000})["max_tokens"] == 384000
    assert build({"model": "deepseek-chat", "messages": MSG, "max_completion_tokens": 100})["max_tokens"] == 100
    assert "max_completion_tokens" not in build(
        {"model": "deepseek-chat", "messages": MSG, "max_completion_tokens": 100}
    )
    for bad in (0, -1, 1.5):
        with pytest.raises(ClientRequestError) as e:
            build({"model": "deepseek-chat", "messages": MSG, "max_tokens": bad})
        assert e.value.param == "max_tokens"


def test_list_limits_and_formats() -> None:
    assert len(build({"model": "deepseek-chat", "messages": MSG, "stop": ["x"] * 16})["stop"]) == 16
    tool = {"type": "function", "function": {"name": "f"}}
    assert len(build({"model": "deepseek-chat", "messages": MSG, "tools": [tool] * 128})["tools"]) == 128
    cases = [
        ({"stop": ["x"] * 17}, "stop"),
        ({"tools": [tool] * 129}, "tools"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
        ({"n": 2}, "n"),
        ({"temperature": 2.5}, "temperature"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ]
    for extra, param in cases:
        with pytest.raises(ClientRequestError) as e:
            build({"model": "deepseek-chat", "messages": MSG, **extra})
        assert e.value.param == param and e.value.status == 400
    out = build({"model": "deepseek-chat", "messages": MSG, "response_format": {"type": "json_object"}, "n": 1})
    assert out["response_format"] == {"type": "json_object"} and "n" not in out


def test_stream_options_only_with_stream_and_usage_always_requested_on_streams() -> None:
    out = build({"model": "deepseek-chat", "messages": MSG, "stream_options": {"include_usage": True}})
    assert "stream_options" not in out
    out = build({"model": "deepseek-chat", "messages": MSG, "stream": True})
    assert out["stream_options"] == {"include_usage": True}
    out = DS.build_request({"model": "alias", "messages": MSG}, ctx("deepseek-v4-pro"))
    assert out["model"] == "deepseek-v4-pro"


# -------------------------------------------------------------------------------------------- response decoding

REASONER = (FIXTURES / "reasoner-stream.sse").read_bytes()
REASONING = "嗯，用户问好。 I should greet back 👋."
ANSWER = "Hello! 你好，世界 🌍."


def test_reasoner_stream_is_cut_invariant_role_once_and_without_junk_chunks() -> None:
    want, tr = relay(REASONER, ctx("deepseek-reasoner", stream=True))
    assert texts(want, "reasoning_content") == REASONING and texts(want, "content") == ANSWER
    deltas = [c["choices"][0]["delta"] for c in want]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert [d.get("role") for d in deltas].count("assistant") == 1
    # Every chunk between the role chunk and the finish chunk carries text.
    assert all(d.get("content") or d.get("reasoning_content") for d in deltas[1:-1])
    assert want[-1]["choices"][0]["finish_reason"] == "stop" and deltas[-1] == {}
    assert all("usage" not in c for c in want)
    assert tr.usage == {
        "prompt_tokens": 13,
        "completion_tokens": 25,
        "total_tokens": 38,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 12},
    }
    for cut in range(len(REASONER) + 1):
        got, _ = relay(REASONER, ctx("deepseek-reasoner", stream=True), cut)
        assert got == want, cut


def test_usage_chunk_with_choices_follows_include_usage() -> None:
    chunks, _ = relay(REASONER, ctx("deepseek-reasoner", stream=True, include_usage=True))
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 38
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    chunks, _ = relay(
        REASONER,
        ctx("deepseek-reasoner", stream=True, include_usage=True),
        client=ClientSettings(usage_fields="deepseek"),
    )
    assert chunks[-1]["usage"]["prompt_cache_hit_tokens"] == 0
    assert chunks[-1]["usage"]["prompt_cache_miss_tokens"] == 13


@pytest.mark.parametrize("mode", ["reasoning_content", "reasoning", "think_tags", "none"])
def test_client_reasoning_formats(mode: str) -> None:
    chunks, _ = relay(REASONER, ctx("deepseek-reasoner", stream=True), client=ClientSettings(reasoning=mode))
    content = texts(chunks, "content")
    if mode == "think_tags":
        assert content == f"<think>{REASONING}</think>\n\n{ANSWER}"
    else:
        assert content == ANSWER
        assert texts(chunks, mode) == (REASONING if mode != "none" else "")
    other = {"reasoning_content", "reasoning"} - {mode}
    assert not any(k in ch["delta"] for c in chunks for ch in c["choices"] for k in other)


def test_insufficient_system_resource_stream_is_an_error_after_the_partial_content() -> None:
    raw = (FIXTURES / "chat-insufficient.sse").read_bytes()
    with pytest.raises(StreamTruncated) as e:
        relay(raw, ctx(stream=True))
    assert e.value.status == 503 and e.value.code == "insufficient_system_resource"
    assert e.value.type == "service_unavailable"
    # What was sent before the error: the partial answer, never a finish_reason.
    c = ctx(stream=True)
    session = DS.session(c)
    answer = Answer()
    normalizer = Normalizer(c.kind, session.reasoning_source, session.starts_in_reasoning, answer)
    encoder = chat_encoder(c, answer, True, False, "reasoning_content", None, True)
    sent = b""
    for event in SSEDecoder().feed(raw):
        if event.data != "[DONE]":
            try:
                sent += encode_events(encoder.feed(normalizer.feed(session.chunk(orjson.loads(event.data)) or {})))
            except StreamTruncated:
                break
    chunks = [orjson.loads(e.data) for e in SSEDecoder().feed(sent)]
    assert texts(chunks, "content") == "The answer is 4"
    assert all(ch["finish_reason"] is None for s in chunks for ch in s["choices"])
    assert answer.usage is not None and answer.usage["prompt_tokens_details"] == {"cached_tokens": 64}


def test_non_stream_reasoner_with_leading_blank_lines_and_cache_fields() -> None:
    data = orjson.loads((FIXTURES / "reasoner.json").read_bytes())
    c = ctx("deepseek-reasoner")
    out = complete(data, c, DS)
    msg = out["choices"][0]["message"]
    assert msg["content"] == "Hello! How can I help you today?" and msg["reasoning_content"] == "The user says hi."
    assert out["usage"]["prompt_tokens_details"] == {"cached_tokens": 8}
    assert out["usage"]["completion_tokens_details"] == {"reasoning_tokens": 5}
    assert "prompt_cache_hit_tokens" not in out["usage"]
    assert out["id"] == "chatcmpl-test" and out["model"] == "deepseek-reasoner"
    data = orjson.loads((FIXTURES / "reasoner.json").read_bytes())
    out = complete(data, c, DS, ClientSettings(usage_fields="deepseek"))
    assert out["usage"]["prompt_cache_hit_tokens"] == 8 and out["usage"]["prompt_cache_miss_tokens"] == 8


def test_nested_cached_tokens_win_over_the_top_level_field() -> None:
    data = json.loads((FIXTURES / "reasoner.json").read_text())
    data["usage"]["prompt_tokens_details"] = {"cached_tokens": 4}
    c = ctx("deepseek-reasoner")
    out = complete(data, c, DS)
    assert out["usage"]["prompt_tokens_details"] == {"cached_tokens": 4}


def test_insufficient_system_resource_non_stream_is_a_retryable_503() -> None:
    data = json.loads((FIXTURES / "reasoner.json").read_text())
    data["choices"][0]["finish_reason"] = "insufficient_system_resource"
    c = ctx("deepseek-reasoner")
    with pytest.raises(UpstreamError) as e:
        complete(data, c, DS)
    assert e.value.status == 503 and e.value.code == "insufficient_system_resource"
    assert "x-should-retry" not in e.value.response_headers()


@pytest.mark.parametrize(
    ("status", "ours", "type_"),
    [
        (402, 402, "insufficient_quota"),
        (429, 429, "rate_limit_error"),
        (401, 401, "authentication_error"),
        (422, 400, "invalid_request_error"),
        (500, 502, "upstream_error"),
        (503, 503, "service_unavailable"),
    ],
)
def test_openai_shaped_errors_keep_status_and_message(status: int, ours: int, type_: str) -> None:
    raw = orjson.dumps(
        {
            "error": {
                "message": "Insufficient Balance",
                "type": "unknown_error",
                "param": None,
                "code": "invalid_request_error",
            }
        }
    )
    err = DS.errors.from_body(status, raw, {"retry-after": "7"})
    assert (err.status, err.type, err.message) == (ours, type_, "Insufficient Balance")
    assert err.response_headers().get("Retry-After") == ("7" if status == 429 else None)
