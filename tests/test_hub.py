"""Hub details not tied to one upstream dialect: unknown fields, role and empty deltas, usage placement."""

from __future__ import annotations

import orjson
from hub_harness import relay, request_context

from proxy.dialects import get_dialect
from proxy.hub.canonical import CHAT
from proxy.settings import UpstreamSettings

UP = UpstreamSettings(name="u", dialect="openai", url="http://127.0.0.1:9")


def sse(*chunks: object) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def ctx(include_usage: bool = False):
    return request_context(CHAT, "m", UP, stream=True, include_usage=include_usage, client_model="alias",
                           response_id="chatcmpl-x")


def test_unknown_fields_pass_through_even_on_small_chunks():
    body = sse({"id": "u1", "x_top": 2, "choices": [{"index": 0, "delta": {"content": "a", "x_d": 1},
                                                     "finish_reason": "stop"}]})
    chunks, _ = relay([body], ctx(), get_dialect("openai"))
    assert chunks[0]["x_top"] == 2 and chunks[0]["choices"][0]["delta"]["x_d"] == 1
    assert chunks[0]["id"] == "chatcmpl-x" and chunks[0]["model"] == "alias"


def test_empty_deltas_after_the_first_are_dropped_and_role_is_sent_once():
    pieces = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": p}}]}
              for p in ["", "Hi", "", " there"]]
    pieces.append({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": "stop"}]})
    chunks, _ = relay([sse(*pieces)], ctx(), get_dialect("openai"))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas == [{"role": "assistant", "content": ""}, {"content": "Hi"}, {"content": " there"}, {}]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_usage_chunk_only_with_include_usage_and_usage_null_elsewhere():
    body = sse({"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "batch_size": [1]}})
    chunks, run = relay([body], ctx(include_usage=True), get_dialect("openai"))
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 1,
                                                                   "total_tokens": 4}
    assert run.usage_extras == {"batch_size": [1]}
    plain, _ = relay([body], ctx(include_usage=False), get_dialect("openai"))
    assert all(c.get("usage") is None for c in plain) and plain[-1]["choices"]
