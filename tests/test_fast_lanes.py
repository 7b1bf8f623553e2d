"""The stream path's fast lanes against its general paths, end to end without I/O: random upstream chunk sequences
(openai deltas, MindIE full-text snapshots) -> SSE bytes -> Pipeline -> each client encoder (chat, responses,
messages) -> the client's bytes.

- fed one whole event per read (SSEDecoder.payloads' fast lane, the normaliser's fast lane, the encoders' hot
  paths), the client gets byte for byte what it gets when the same bytes arrive cut anywhere (the decoder's general
  loop) and every chunk takes the normaliser's general path;
- every event an encoder writes is compact JSON exactly as orjson writes it (the cached-bytes hot paths splice
  strings into pre-serialised bytes: a wrong splice would show here), with consecutive Responses sequence numbers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hub_harness import drive, request_context
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.clients.base import Encoder
from proxy.clients.chat import chat_encoder
from proxy.clients.messages_encoder import MessagesCall, MessagesEncoder, messages_consumer
from proxy.clients.responses_events import Echo, ResponsesEncoder, responses_consumer
from proxy.clients.signature import ThinkingSigner
from proxy.dialects import get_dialect
from proxy.errors import ProxyError
from proxy.hub.canonical import CHAT
from proxy.hub.events import Answer
from proxy.hub.pipeline import Pipeline
from proxy.hub.sse import SSEDecoder
from proxy.settings import UpstreamSettings

SIGNER = ThinkingSigner(b"k" * 32)
TEXT = st.one_of(
    st.sampled_from([" tok", "a", "", "<think>", "</think>\n\n", "é😀", '"q"\\', "\u2028", "\ufffd"]),
    st.text(alphabet=st.sampled_from(["a", " ", "<", "/", ">", "\n", "é", '"', "\x00"]), max_size=6),
)
DELTA = st.one_of(
    st.builds(lambda t: {"content": t}, TEXT),
    st.builds(lambda t: {"content": t}, TEXT),
    st.builds(lambda t: {"role": "assistant", "content": t}, TEXT),
    st.builds(lambda t: {"reasoning_content": t}, TEXT),
    st.builds(lambda t: {"content": t, "reasoning_content": None}, TEXT),
    st.just({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                             "function": {"name": "get_weather", "arguments": '{"city":'}}]}),
    st.just({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
    st.just({"content": "x", "refusal": None}),
)
CHOICE_EXTRA: st.SearchStrategy[dict[str, Any]] = st.sampled_from([
    {}, {}, {}, {"logprobs": None}, {"logprobs": {"content": []}}, {"stop_reason": None}])
ENVELOPE: st.SearchStrategy[dict[str, Any]] = st.sampled_from([
    {}, {"system_fingerprint": "fp_1"}, {"system_fingerprint": "fp_2", "x_vendor": 1}])


@st.composite
def openai_stream(draw: st.DrawFn, varying: bool) -> list[bytes]:
    """One SSE event per element: a role chunk, deltas, a finish chunk, a usage chunk, [DONE]. `varying`: envelope
    fields (system_fingerprint ...) that change from chunk to chunk."""
    envelope = {"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1, "model": "m", **draw(ENVELOPE)}
    events = [{**envelope, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                        "logprobs": None, "finish_reason": None}]}]
    for delta in draw(st.lists(DELTA, max_size=14)):
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, **draw(CHOICE_EXTRA)}
        events.append({**envelope, **(draw(ENVELOPE) if varying else {}), "choices": [choice]})
    finish = draw(st.sampled_from(["stop", "length", "tool_calls"]))
    events.append({**envelope, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}]})
    events.append({**envelope, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5,
                                                        "total_tokens": 8}})
    return [b"data: " + orjson.dumps(e) + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


@st.composite
def mindie_full_text_stream(draw: st.DrawFn) -> list[bytes]:
    """Cumulative snapshots (each chunk's content is the whole text so far), full_text on the finishing chunk."""
    envelope = {"id": "endpoint_common_1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    events = [{**envelope, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                        "finish_reason": None}]}]
    text = ""
    for piece in draw(st.lists(TEXT, max_size=14)):
        text += piece
        events.append({**envelope, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text},
                                                "finish_reason": None}]})
    events.append({**envelope, "full_text": text, "usage": {"prompt_tokens": 3, "completion_tokens": 5,
                                                            "total_tokens": 8},
                   "choices": [{"index": 0, "delta": {"role": "assistant", "content": text},
                                "finish_reason": "stop"}]})
    return [b"data: " + orjson.dumps(e) + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


def chat(ctx: Any, answer: Answer) -> Encoder:
    return chat_encoder(ctx, answer, True, True, "reasoning_content", None, True)


def responses(ctx: Any, answer: Answer) -> Encoder:
    return ResponsesEncoder(ctx, answer, responses_consumer(True), Echo({"store": False}), {}, None)


def messages(ctx: Any, answer: Answer) -> Encoder:
    call = MessagesCall({"model": "m", "messages": []}, "alias", True)
    return MessagesEncoder(call, ctx, answer, SIGNER, messages_consumer(call, ctx))


ENCODERS: dict[str, Callable[[Any, Answer], Encoder]] = {"chat": chat, "responses": responses, "messages": messages}


def run(dialect: str, pieces: list[bytes], client: str, source: str, general: bool) -> bytes:
    upstream = UpstreamSettings(name="u", dialect=dialect, url="http://127.0.0.1:9", full_text=dialect == "mindie",
                                reasoning_source=source)
    ctx = request_context(CHAT, "m", upstream, stream=True, client_model="alias", response_id="resp_0123456789")
    answer = Answer()
    pipeline = Pipeline(get_dialect(dialect).session(ctx), answer)
    if general:
        pipeline.normalizer.fast_lane = False
    encoder = ENCODERS[client](ctx, answer)
    try:
        out = drive(pieces, pipeline, encoder)
    except ProxyError as e:  # e.g. tool arguments the Messages client cannot take: both paths must agree
        return b"error: " + e.message.encode()
    # the id made up for a call whose first fragment had none is random; a Responses completion time is the clock's
    # (two runs may straddle a second)
    return _COMPLETED_AT.sub(b'"completed_at":0', _CALL_ID.sub(b"call_<new>", out))


_CALL_ID = re.compile(rb"call_[0-9a-f]{24}")
_COMPLETED_AT = re.compile(rb'"completed_at":[0-9]+')


def cut(raw: bytes, points: list[int]) -> list[bytes]:
    bounds = sorted({p % (len(raw) + 1) for p in points})
    return [raw[a:b] for a, b in zip([0, *bounds], [*bounds, len(raw)], strict=True)]


def check_events(raw: bytes, client: str) -> None:
    events = SSEDecoder().feed(raw)
    assert events
    seq = []
    for event in events:
        if event.data == "[DONE]":
            continue
        assert orjson.dumps(orjson.loads(event.data)) == event.data.encode()
        data = orjson.loads(event.data)
        if client != "chat":
            assert event.event == data["type"]
        if client == "responses":
            seq.append(data["sequence_number"])
    assert seq == list(range(len(seq)))


@pytest.mark.parametrize("client", ENCODERS)
@settings(max_examples=120, deadline=None)
@given(data=st.data(), source=st.sampled_from(["auto", "field", "none"]))
def test_openai_fast_lanes_are_the_general_paths(client: str, data: st.DataObject, source: str) -> None:
    pieces = data.draw(openai_stream(varying=False))
    points = data.draw(st.lists(st.integers(0, 4000), max_size=20))
    fast = run("openai", pieces, client, source, general=False)
    assert fast == run("openai", cut(b"".join(pieces), points), client, source, general=True)
    assert fast == run("openai", [b"".join(pieces)], client, source, general=False)  # all events in one read
    if not fast.startswith(b"error: "):
        check_events(fast, client)


@pytest.mark.parametrize("client", ENCODERS)
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_changing_envelope_fields_take_the_general_paths_alike(client: str, data: st.DataObject) -> None:
    # The envelope fields a chunk goes out with are those known when its read is encoded, so the reads keep their
    # events here: each event is cut in two (the decoder's general loop), not spread across reads.
    pieces = data.draw(openai_stream(varying=True))
    halves = [half for piece in pieces for half in (piece[:len(piece) // 2], piece[len(piece) // 2:])]
    fast = run("openai", pieces, client, "auto", general=False)
    assert fast == run("openai", halves, client, "auto", general=True)
    if not fast.startswith(b"error: "):
        check_events(fast, client)


@pytest.mark.parametrize("client", ENCODERS)
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_mindie_full_text_fast_lanes_are_the_general_paths(client: str, data: st.DataObject) -> None:
    pieces = data.draw(mindie_full_text_stream())
    points = data.draw(st.lists(st.integers(0, 4000), max_size=20))
    fast = run("mindie", pieces, client, "auto", general=False)
    assert fast == run("mindie", cut(b"".join(pieces), points), client, "auto", general=True)
    check_events(fast, client)


def test_invalid_utf8_in_a_whole_event_becomes_replacement_characters() -> None:
    role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    bad = b'data: {"choices":[{"index":0,"delta":{"content":"a\xffb"}}]}\n\n'
    done = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    fast = run("openai", [role, bad, done], "chat", "auto", general=False)
    assert '"a\ufffdb"'.encode() in fast
    assert fast == run("openai", [role + bad[:3], bad[3:] + done], "chat", "auto", general=True)


def _chunk(delta: dict[str, Any], **envelope: Any) -> bytes:
    event = {"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1, "model": "m", **envelope,
             "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}
    return b"data: " + orjson.dumps(event) + b"\n\n"


@pytest.mark.parametrize("client", ENCODERS)
def test_a_text_event_after_the_envelope_changed_carries_the_new_envelope(client: str) -> None:
    """Found by the test above: the text lane learned a reasoning event under system_fingerprint fp_1; a tool call
    under fp_2 then changed the answer's envelope; the next fp_1 reasoning event matched the template, and the lane
    answered it without the envelope going back to fp_1 (the general path sets it from every event)."""
    call = {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city":'}}]}
    pieces = [_chunk({"role": "assistant", "content": ""}),
              _chunk({"reasoning_content": " tok"}, system_fingerprint="fp_1"),
              _chunk({"content": " tok"}),
              _chunk(call, system_fingerprint="fp_2", x_vendor=1),
              _chunk({"reasoning_content": " tok"}, system_fingerprint="fp_1"),
              _chunk({"reasoning_content": " tok"}, system_fingerprint="fp_1"),
              b'data: {"id":"chatcmpl-up","object":"chat.completion.chunk","created":1,"model":"m",'
              b'"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}\n\n',
              b"data: [DONE]\n\n"]
    halves = [half for piece in pieces for half in (piece[:len(piece) // 2], piece[len(piece) // 2:])]
    fast = run("openai", pieces, client, "auto", general=False)
    assert fast == run("openai", halves, client, "auto", general=True)
    if client == "chat":
        last = [line for line in fast.split(b"\n\n") if b'"finish_reason":"stop"' in line][0]
        assert b'"system_fingerprint":"fp_1"' in last
