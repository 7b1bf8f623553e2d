"""engine dialect: request mapping (no model, drops, do_sample, limits) and decoding of the document's shapes."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest
from hub_harness import complete, request_context
from hub_harness import relay as hub_relay

from proxy.dialects.engine import EngineDialect
from proxy.errors import ClientRequestError
from proxy.hub.canonical import CHAT, COMPLETIONS, RequestContext
from proxy.settings import ClientSettings, UpstreamSettings

FIXTURES = Path(__file__).parent.parent / "fixtures" / "engine"
EN = EngineDialect()
MSG = [{"role": "user", "content": "hi"}]


def ctx(kind: str = CHAT, *, stream: bool = False, include_usage: bool = False) -> RequestContext:
    up = UpstreamSettings(name="en", dialect="engine", url="http://127.0.0.1:9")
    return request_context(
        kind,
        "my-engine",
        up,
        stream=stream,
        include_usage=include_usage,
        response_id=("chatcmpl-" if kind == CHAT else "cmpl-") + "test",
        created=7,
    )


def build(body: dict[str, Any], c: RequestContext | None = None) -> dict[str, Any]:
    before = copy.deepcopy(body)
    out = EN.build_request(body, c or ctx(stream=body.get("stream") is True))
    assert body == before
    return out


def relay(
    raw: bytes, c: RequestContext, cut: int | None = None, client: ClientSettings | None = None
) -> list[dict[str, Any]]:
    """Upstream bytes (cut in two at `cut`) -> the proxy's own pipeline and chat encoder -> client chunks."""
    return hub_relay([raw] if cut is None else [raw[:cut], raw[cut:]], c, EN, client)[0]


# ---------------------------------------------------------------------------------------------------- requests


def test_paths_have_no_v1_and_no_model_listing() -> None:
    assert (EN.path(CHAT), EN.path(COMPLETIONS), EN.path("models")) == ("/chat", "/completion", None)


def test_model_never_sent_and_documented_drops() -> None:
    out = build(
        {
            "model": "my-engine",
            "messages": MSG,
            "response_format": {"type": "text"},
            "user": "u1",
            "seed": 42,
            "thinking": {"type": "enabled"},
            "reasoning_effort": "low",
            "top_k": 5,
        }
    )
    for key in ("model", "response_format", "user", "seed", "thinking", "reasoning_effort"):
        assert key not in out
    assert out["top_k"] == 5  # anything else passes through


@pytest.mark.parametrize(
    ("extra", "do_sample"),
    [
        ({"temperature": 0}, False),
        ({"temperature": 0.0}, False),
        ({}, True),
        ({"temperature": 0.7}, True),
        ({"temperature": 0, "do_sample": True}, True),
        ({"temperature": 1, "do_sample": False}, False),
    ],
)
def test_do_sample(extra: dict[str, Any], do_sample: bool) -> None:
    out = build({"model": "m", "messages": MSG, **extra})
    assert out["do_sample"] is do_sample
    assert "ww" not in out and out.get("temperature") == extra.get("temperature")


def test_messages_lose_unsupported_name_and_round_tripped_reasoning() -> None:
    msgs = [
        {"role": "system", "content": "s", "name": "sys"},
        {"role": "user", "content": "q", "name": "bob"},
        {"role": "assistant", "content": "a", "reasoning_content": "r", "reasoning": "r"},
        {"role": "user", "content": "q2"},
    ]
    out = build({"model": "m", "messages": msgs})
    assert out["messages"] == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "q2"},
    ]


def test_developer_role_and_string_content_where_the_document_wants_it() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    msgs = [
        {"role": "developer", "content": parts},
        {"role": "user", "content": parts},
        {"role": "assistant", "content": parts},
        {"role": "user", "content": "q"},
    ]
    out = build({"model": "m", "messages": msgs})
    assert out["messages"] == [
        {"role": "system", "content": "a\nb"},
        {"role": "user", "content": parts},
        {"role": "assistant", "content": "a\nb"},
        {"role": "user", "content": "q"},
    ]


def test_limits_from_the_document() -> None:
    tool = {"type": "function", "function": {"name": "f"}}
    for extra, param in (
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"tools": [tool] * 129}, "tools"),
        ({"temperature": 3}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
    ):
        with pytest.raises(ClientRequestError) as e:
            build({"model": "m", "messages": MSG, **extra})
        assert e.value.param == param
    out = build({"model": "m", "messages": MSG, "stop": ["a", "b", "c", "d"], "max_completion_tokens": 9})
    assert out["max_tokens"] == 9 and "max_completion_tokens" not in out


def test_stream_options_only_on_streams() -> None:
    assert "stream_options" not in build({"model": "m", "messages": MSG, "stream_options": {"include_usage": True}})
    out = build({"model": "m", "messages": MSG, "stream": True})
    assert out["stream_options"] == {"include_usage": True}


def test_prefix_continuation_is_refused_clearly() -> None:
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "Once", "prefix": True}]
    with pytest.raises(ClientRequestError) as e:
        build({"model": "m", "messages": msgs})
    assert e.value.status == 400 and e.value.param == "messages[1].prefix" and "engine" in e.value.message


def test_completion_request() -> None:
    out = EN.build_request(
        {"model": "m", "prompt": "Once", "temperature": 0, "user": "u", "echo": True}, ctx(COMPLETIONS)
    )
    assert out == {"prompt": "Once", "temperature": 0, "echo": True, "do_sample": False}


# --------------------------------------------------------------------------------------------------- responses


def test_document_shaped_chat_object_is_filled_to_openai() -> None:
    data = orjson.loads((FIXTURES / "chat.json").read_bytes())
    c = ctx()
    out = complete(data, c, EN)
    assert out == {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 7,
        "model": "my-engine",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hi there.", "refusal": None, "annotations": []},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    }


def test_tool_call_stream_is_cut_invariant_and_normalised() -> None:
    raw = (FIXTURES / "chat-tool-stream.sse").read_bytes()
    want = relay(raw, ctx(stream=True, include_usage=True))
    for cut in range(len(raw) + 1):
        assert relay(raw, ctx(stream=True, include_usage=True), cut) == want, cut
    calls = [tc for c in want for ch in c["choices"] for tc in ch["delta"].get("tool_calls") or ()]
    assert calls[0] == {
        "index": 0,
        "id": "call_x1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    assert "".join(tc["function"]["arguments"] for tc in calls) == '{"city": "Paris"}'
    assert all(set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"} for tc in calls[1:])
    assert want[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert want[-1]["choices"] == [] and want[-1]["usage"]["total_tokens"] == 29
    assert {c["model"] for c in want} == {"my-engine"} and {c["id"] for c in want} == {"chatcmpl-test"}
    without = relay(raw, ctx(stream=True))
    assert all("usage" not in c for c in without) and len(without) == len(want) - 1


def test_completion_stream_with_usage_on_every_object() -> None:
    raw = (FIXTURES / "completion-stream.sse").read_bytes()
    chunks = relay(raw, ctx(COMPLETIONS, stream=True))
    assert "".join(ch["text"] for c in chunks for ch in c["choices"]) == "Once upon a time"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in c and c["object"] == "text_completion" and c["id"] == "cmpl-test" for c in chunks)
    with_usage = relay(raw, ctx(COMPLETIONS, stream=True, include_usage=True))
    assert with_usage[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


def test_documented_content_filter_wording_is_mapped() -> None:
    data = orjson.loads((FIXTURES / "chat.json").read_bytes())
    data["choices"][0]["finish_reason"] = "content_filter(TBD?)"
    c = ctx()
    out = complete(data, c, EN)
    assert out["choices"][0]["finish_reason"] == "content_filter"
