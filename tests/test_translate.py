"""ResponseTranslator details not tied to one dialect."""

from __future__ import annotations

from proxy.canonical import CHAT, RequestContext
from proxy.settings import ClientSettings, UpstreamSettings
from proxy.translate import ResponseTranslator


def ctx(include_usage: bool = False) -> RequestContext:
    up = UpstreamSettings(name="u", dialect="openai", url="http://127.0.0.1:9")
    return RequestContext(kind=CHAT, request_id="r", client_model="alias", upstream_model="m", upstream=up,
                          stream=True, include_usage=include_usage, response_id="chatcmpl-x", created=1)


def test_unknown_fields_pass_through_even_on_small_chunks():
    tr = ResponseTranslator(ctx(), ClientSettings(), "auto")
    out = tr.feed({"id": "u1", "x_top": 2, "choices": [{"index": 0, "delta": {"content": "a", "x_d": 1}}]})
    assert out[0]["x_top"] == 2 and out[0]["choices"][0]["delta"]["x_d"] == 1
    assert out[0]["id"] == "chatcmpl-x" and out[0]["model"] == "alias"


def test_empty_deltas_after_the_first_are_dropped_and_role_is_sent_once():
    tr = ResponseTranslator(ctx(), ClientSettings(), "auto")
    chunks = []
    for piece in ["", "Hi", "", " there"]:
        chunks += tr.feed({"choices": [{"index": 0, "delta": {"role": "assistant", "content": piece}}]})
    chunks += tr.feed({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                    "finish_reason": "stop"}]})
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas == [{"role": "assistant", "content": ""}, {"content": "Hi"}, {"content": " there"}, {}]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert tr.finish(True) == []


def test_usage_chunk_only_with_include_usage_and_usage_null_elsewhere():
    tr = ResponseTranslator(ctx(include_usage=True), ClientSettings(), "auto")
    out = tr.feed({"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": "stop"}],
                   "usage": {"prompt_tokens": 3, "completion_tokens": 1, "batch_size": [1]}})
    assert out[0]["usage"] is None
    tail = tr.finish(True)
    assert tail[0]["choices"] == [] and tail[0]["usage"] == {"prompt_tokens": 3, "completion_tokens": 1,
                                                             "total_tokens": 4}
    assert tr.usage_extras == {"batch_size": [1]}
