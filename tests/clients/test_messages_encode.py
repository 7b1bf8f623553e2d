"""Hub events -> Anthropic Messages (proxy/clients/messages_encoder.py), driven through the real pipeline from
upstream bytes, and the Anthropic error shapes (proxy/clients/messages_errors.py)."""

from __future__ import annotations

from typing import Any

import orjson
from hub_harness import request_context
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.clients.messages_encoder import PING, MessagesCall, MessagesEncoder, messages_consumer
from proxy.clients.messages_errors import error_response
from proxy.clients.signature import ThinkingSigner
from proxy.dialects import get_dialect
from proxy.errors import ProxyError, StreamTruncated, UpstreamError
from proxy.hub.canonical import CHAT
from proxy.hub.events import Answer, Delta
from proxy.hub.pipeline import Pipeline
from proxy.hub.sse import SSEDecoder, encode_events
from proxy.settings import UpstreamSettings

UP = UpstreamSettings(name="u", dialect="openai", url="http://127.0.0.1:9")
SIGNER = ThinkingSigner(b"k" * 32)


def sse(*chunks: object) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def delta(**d: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": d, "finish_reason": None}]}


# reasoning, then text, then two streamed tool calls, usage with a cached part
AGENT_TURN = sse(
    delta(role="assistant", content=""),
    delta(reasoning_content="Need "), delta(reasoning_content="the weather 🌍."),
    delta(content="Checking"), delta(content=" now."),
    delta(tool_calls=[{"index": 0, "id": "call_a", "type": "function", "function": {"name": "get_weather",
                                                                                     "arguments": ""}}]),
    delta(tool_calls=[{"index": 0, "function": {"arguments": '{"city": '}}]),
    delta(tool_calls=[{"index": 0, "function": {"arguments": '"Paris"}'}}]),
    delta(tool_calls=[{"index": 1, "id": "call_b", "type": "function", "function": {"name": "get_time",
                                                                                     "arguments": "{}"}}]),
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    {"choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70,
                              "prompt_tokens_details": {"cached_tokens": 32}}},
)


def call(stream: bool, **options: Any) -> MessagesCall:
    """A request that enabled thinking (`show_thinking`, what proxy/clients/messages.py decodes from `thinking`)."""
    return MessagesCall({"model": "m", "messages": []}, "alias", stream, **{"show_thinking": True, **options})


def run(pieces: list[bytes], stream: bool = True, **options: Any) -> bytes:
    ctx = request_context(CHAT, "m", UP, stream=stream, client_model="alias", response_id="msg_x")
    answer = Answer()
    session = get_dialect("openai").session(ctx)
    pipeline = Pipeline(session, answer)
    request = call(stream, **options)
    encoder = MessagesEncoder(request, ctx, answer, SIGNER, messages_consumer(request, ctx))
    out = encoder.head() if stream else []
    events: list[Delta] = []
    for piece in pieces:
        pipeline.feed(piece, events)
        out += encoder.feed(events)
        events.clear()
    pipeline.finish(events)
    out += encoder.feed(events)
    if not stream:
        (whole,) = encoder.finish()
        return whole.data
    return encode_events(out + encoder.finish())


def events_of(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    return [(e.event or "", orjson.loads(e.data)) for e in SSEDecoder().feed(raw)]


def test_stream_events_in_anthropic_order():
    events = events_of(run([AGENT_TURN]))
    names = [name for name, _ in events]
    assert names == [
        "message_start",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_delta",
        "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]
    assert all(name == data["type"] for name, data in events)
    start = events[0][1]["message"]
    assert start["id"] == "msg_x" and start["model"] == "alias" and start["role"] == "assistant"
    assert start["content"] == [] and start["stop_reason"] is None
    thinking = [d["delta"] for n, d in events[2:5]]
    assert thinking[:2] == [{"type": "thinking_delta", "thinking": "Need "},
                            {"type": "thinking_delta", "thinking": "the weather 🌍."}]
    assert thinking[2]["type"] == "signature_delta"
    assert SIGNER.open("Need the weather 🌍.", thinking[2]["signature"]) == ("Need the weather 🌍.", True)
    tool = events[10][1]["content_block"]
    assert tool == {"type": "tool_use", "id": "toolu_call_a", "name": "get_weather", "input": {},
                    "caller": {"type": "direct"}}
    assert events[6][1]["content_block"] == {"type": "text", "text": "", "citations": []}
    assert [d["delta"]["partial_json"] for _, d in events[11:13]] == ['{"city": ', '"Paris"}']
    assert events[14][1]["content_block"]["id"] == "toolu_call_b"
    assert [d["index"] for _, d in events if "index" in d] == [0] * 5 + [1] * 4 + [2] * 4 + [3] * 3
    final = events[-2][1]
    assert final["delta"] == {"stop_reason": "tool_use", "stop_sequence": None, "stop_details": None,
                              "container": None}
    assert final["usage"] == {"input_tokens": 18, "output_tokens": 20, "cache_creation_input_tokens": 0,
                              "cache_read_input_tokens": 32, "output_tokens_details": None, "server_tool_use": None}


def test_non_stream_is_the_same_answer_folded():
    body = orjson.loads(run([AGENT_TURN], stream=False))
    signature = events_of(run([AGENT_TURN]))[4][1]["delta"]["signature"]
    assert body == {
        "id": "msg_x", "type": "message", "role": "assistant", "model": "alias",
        "content": [
            {"type": "thinking", "thinking": "Need the weather 🌍.", "signature": signature},
            {"type": "text", "text": "Checking now.", "citations": []},
            {"type": "tool_use", "id": "toolu_call_a", "name": "get_weather", "input": {"city": "Paris"},
             "caller": {"type": "direct"}},
            {"type": "tool_use", "id": "toolu_call_b", "name": "get_time", "input": {}, "caller": {"type": "direct"}},
        ],
        "stop_reason": "tool_use", "stop_sequence": None, "stop_details": None, "container": None,
        "usage": {"input_tokens": 18, "output_tokens": 20, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 32, "output_tokens_details": None, "server_tool_use": None,
                  "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
                  "service_tier": None, "inference_geo": None},
    }


def test_without_thinking_enabled_the_reasoning_is_left_out():
    """docs/decisions.md "Client dialects and state": thinking blocks only when the request enabled thinking; code
    that reads content[0].text works."""
    body = orjson.loads(run([AGENT_TURN], stream=False, show_thinking=False))
    assert [b["type"] for b in body["content"]] == ["text", "tool_use", "tool_use"]
    assert body["content"][0]["text"] == "Checking now." and body["usage"]["output_tokens"] == 20
    events = events_of(run([AGENT_TURN], show_thinking=False))
    assert not [d for _, d in events if "thinking" in str(d.get("content_block", d.get("delta", "")))]
    assert [d["index"] for _, d in events if "index" in d] == [0] * 4 + [1] * 4 + [2] * 3


def test_thinking_token_count_where_the_upstream_gives_one():
    turn = sse(delta(content="x"), {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                                    "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14,
                                              "completion_tokens_details": {"reasoning_tokens": 7}}})
    assert orjson.loads(run([turn], stream=False))["usage"]["output_tokens_details"] == {"thinking_tokens": 7}


def test_omitted_thinking_sends_no_text_and_carries_it_in_the_signature():
    events = events_of(run([AGENT_TURN], omit_thinking=True))
    block = [d for n, d in events if n == "content_block_delta" and d["index"] == 0]
    assert [d["delta"]["type"] for d in block] == ["signature_delta"]
    assert SIGNER.open("", block[0]["delta"]["signature"]) == ("Need the weather 🌍.", True)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(AGENT_TURN)), max_size=12))
def test_cutting_the_upstream_bytes_anywhere_gives_the_same_events(cuts: list[int]):
    points = sorted(set(cuts))
    pieces = [AGENT_TURN[a:b] for a, b in zip([0, *points], [*points, len(AGENT_TURN)], strict=True)]
    assert events_of(run(pieces)) == events_of(run([AGENT_TURN]))


def test_every_single_byte_cut_gives_the_same_events():
    whole = events_of(run([AGENT_TURN]))
    for i in range(len(AGENT_TURN) + 1):
        assert events_of(run([AGENT_TURN[:i], AGENT_TURN[i:]])) == whole


def test_stop_reasons():
    def stop(finish: str, **extra: Any) -> tuple[str, Any]:
        body = orjson.loads(run([sse({"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": finish,
                                                    **extra}]})], stream=False, stop_sequences=("END",)))
        return body["stop_reason"], body["stop_sequence"]

    assert stop("stop") == ("end_turn", None)
    assert stop("length") == ("max_tokens", None)
    assert stop("stop", stop_reason="END") == ("stop_sequence", "END")  # vLLM names the matched stop string
    assert stop("content_filter") == ("refusal", None)


def test_arguments_that_are_not_an_object_fail_the_non_stream_answer():
    bad = sse(delta(tool_calls=[{"index": 0, "id": "c", "type": "function",
                                 "function": {"name": "f", "arguments": "[1, 2"}}]),
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    try:
        run([bad], stream=False)
    except UpstreamError as err:
        assert "not a JSON object" in err.message
    else:
        raise AssertionError("expected an UpstreamError")


def test_error_event_and_ping():
    ctx = request_context(CHAT, "m", UP, stream=True, response_id="msg_x")
    encoder = MessagesEncoder(call(True), ctx, Answer(), SIGNER, messages_consumer(call(True), ctx))
    name, data = events_of(encode_events([encoder.error(StreamTruncated("upstream cut", status=502))]))[0]
    # request_id: the request's own (its x-request-id), not null
    assert name == "error" and data == {"type": "error", "error": {"type": "api_error", "message": "upstream cut"},
                                        "request_id": "rid"}
    assert events_of(encode_events([PING])) == [("ping", {"type": "ping"})] and encoder.keepalive is PING


def test_error_statuses_and_types():
    def shape(err: ProxyError) -> tuple[int, str, dict[bytes, bytes]]:
        status, headers, body = error_response(err)
        data = orjson.loads(body)
        assert data["type"] == "error" and data["error"]["message"] == err.message
        return status, data["error"]["type"], dict(headers)

    assert shape(ProxyError("x", 503))[:2] == (529, "overloaded_error")
    assert shape(ProxyError("x", 502))[:2] == (502, "api_error")
    assert shape(ProxyError("x", 504))[:2] == (504, "api_error")
    status, kind, headers = shape(ProxyError("x", 429, headers={"Retry-After": "7"}))
    assert (status, kind, headers[b"retry-after"]) == (429, "rate_limit_error", b"7")
    assert shape(ProxyError("x", 401))[:2] == (401, "authentication_error")
    assert shape(ProxyError("x", 403))[:2] == (403, "permission_error")
    assert shape(ProxyError("x", 404))[:2] == (404, "not_found_error")
    assert shape(ProxyError("x", 413))[:2] == (413, "request_too_large")
    status, kind, headers = shape(ProxyError("x", 400))
    assert (status, kind, headers[b"x-should-retry"]) == (400, "invalid_request_error", b"false")
    assert shape(ProxyError("x", 500))[:2] == (500, "api_error")
