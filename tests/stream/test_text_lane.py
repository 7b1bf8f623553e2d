"""The text lane (proxy/stream/text_lane.py) gives exactly what the full path gives: random upstream streams through a
pipeline with the lane and one without (`Pipeline(..., text_lane=False)`) produce the same events, the same answer
and the same errors, whatever the upstream dialect, the JSON spelling and where the bytes are cut; with `runs` (the
lane's runs as TextRuns), the same events once each run is its Deltas."""

from __future__ import annotations

import itertools
import json
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.dialects import DIALECTS
from proxy.errors import ProxyError
from proxy.hub.canonical import CHAT
from proxy.hub.events import Answer, Delta, TextRun
from proxy.hub.pipeline import Pipeline
from proxy.hub.sse import SSEEvent
from proxy.settings import UpstreamSettings
from proxy.stream.text_lane import TextLane
from tests.hub_harness import request_context

TEXTS = st.one_of(
    st.sampled_from(["Hello", " world", "<think>", "</think>", "a\"b", "back\\slash", '"content":"x"', "\\\"", "é",
                     "😀", "\n\n", " ", "<thi", "nk>", "\u2028"]),
    st.text(max_size=12),
)
DELTA_SHAPES = st.sampled_from(["content", "content", "content", "role+content", "reasoning_content", "reasoning",
                                "content+null_reasoning", "empty_content", "tool", "empty", "refusal"])


@st.composite
def chunk(draw: Any, ids: list[str], logprobs: bool) -> dict[str, Any]:
    shape = draw(DELTA_SHAPES)
    text = draw(TEXTS)
    delta: dict[str, Any]
    if shape == "content":
        delta = {"content": text}
    elif shape == "role+content":
        delta = {"role": "assistant", "content": text}
    elif shape == "reasoning_content":
        delta = {"content": None, "reasoning_content": text}
    elif shape == "reasoning":
        delta = {"reasoning": text}
    elif shape == "content+null_reasoning":
        delta = {"content": text, "reasoning_content": None}
    elif shape == "empty_content":
        delta = {"content": ""}
    elif shape == "tool":
        delta = {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                 "function": {"name": "f", "arguments": text}}]}
    elif shape == "refusal":
        delta = {"content": text, "refusal": None}
    else:
        delta = {}
    choice: dict[str, Any] = {"index": draw(st.sampled_from([0, 0, 0, 0, 1])), "delta": delta}
    if logprobs:
        choice["logprobs"] = None
    choice["finish_reason"] = draw(st.sampled_from([None] * 12 + ["stop", "length", "tool_calls", ERROR_FINISH]))
    out: dict[str, Any] = {"id": draw(st.sampled_from(ids)), "object": "chat.completion.chunk", "created": 1,
                           "model": "m", "choices": [choice]}
    if draw(st.integers(0, 9)) == 0:
        out["system_fingerprint"] = draw(st.sampled_from(["fp_1", "fp_2"]))
    if draw(st.integers(0, 9)) == 0:
        out["usage"] = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    if draw(st.integers(0, 14)) == 0:
        out["choices"].append({"index": 1, "delta": {"content": text}, "finish_reason": None})
    return out


ERROR_FINISH = "insufficient_system_resource"  # DeepSeek: an error finish reason, raised after its partial content

SPELLINGS = [
    lambda d: orjson.dumps(d).decode(),
    lambda d: json.dumps(d),  # ", " and ": " separators, non-ASCII as \\u escapes
    lambda d: json.dumps(d, ensure_ascii=False, separators=(",", ":")),
]

# (dialect, full_text): OpenAI passthrough, DeepSeek, MindIE plain and cumulative, the engine.
UPSTREAMS = [("openai", False), ("deepseek", False), ("mindie", False), ("mindie", True), ("engine", False),
             ("siliconstorm", False)]


def run(raw: bytes, cuts: list[int], dialect: str, full_text: bool, lane: bool,
        model: str = "m", runs: bool = False) -> tuple[list[Delta], tuple[Any, ...], str | None]:
    upstream = UpstreamSettings(name="u", dialect=dialect, url="http://127.0.0.1:1", full_text=full_text)
    ctx = request_context(CHAT, model, upstream, stream=True)
    session = DIALECTS[dialect]().session(ctx)
    answer = Answer()
    pipeline = Pipeline(session, answer, text_lane=lane, runs=runs)
    events: list[Delta | TextRun] = []
    error = None
    points = sorted({min(c, len(raw)) for c in cuts}) + [len(raw)]
    start = 0
    try:
        for point in points:
            pipeline.feed(raw[start:point], events)
            start = point
            if pipeline.done:
                break
        pipeline.finish(events)
    except ProxyError as e:
        error = f"{type(e).__name__}: {e.message}"
    facts = (answer.usage, answer.usage_extras, answer.envelope_extra, answer.finish_reason, answer.upstream_id)
    if runs:
        assert all(e.texts and all(e.texts) for e in events if isinstance(e, TextRun))
    deltas = [d for e in events for d in (e.deltas() if isinstance(e, TextRun) else [e])]
    return deltas, facts, error


@settings(max_examples=400, deadline=None)
@given(
    st.data(),
    st.sampled_from(UPSTREAMS),
    st.sampled_from(range(len(SPELLINGS))),
    st.lists(st.integers(0, 4000), max_size=8),
    st.sampled_from(["m", "deepseek-r1"]),  # an R1 name starts in reasoning (inline tags split)
)
def test_the_lane_gives_what_the_full_path_gives(data: Any, upstream: tuple[str, bool], spelling: int,
                                                 cuts: list[int], model: str) -> None:
    ids = ["chatcmpl-1"] if data.draw(st.booleans()) else ["chatcmpl-1", "chatcmpl-2"]
    chunks = data.draw(st.lists(chunk(ids, data.draw(st.booleans())), min_size=1, max_size=30))
    if data.draw(st.booleans()):  # a fast text stream: events repeated with other texts (the lane's runs)
        repeated = []
        for c in chunks:
            repeated.append(c)
            for _ in range(data.draw(st.integers(0, 4))):
                again = json.loads(json.dumps(c))
                for field in ("content", "reasoning_content", "reasoning"):
                    if isinstance(again["choices"][0]["delta"].get(field), str):
                        again["choices"][0]["delta"][field] = data.draw(TEXTS)
                repeated.append(again)
        chunks = repeated
    dialect, full_text = upstream
    if full_text:  # MindIE fullTextEnabled: each text is the whole text so far (now and then revised)
        so_far = ""
        for c in chunks:
            delta = c["choices"][0]["delta"]
            if delta.get("content"):
                so_far = delta["content"] if data.draw(st.integers(0, 9)) == 0 else so_far + delta["content"]
                delta["content"] = so_far
    dump = SPELLINGS[spelling]
    events = [b"data: " + dump(c).encode() + b"\n\n" for c in chunks]
    if data.draw(st.booleans()):
        events.append(b"data: [DONE]\n\n")
    raw = b"".join(events)
    if data.draw(st.booleans()):  # reads of whole events, several to a read (a fast upstream): runs on the lane
        ends = list(itertools.accumulate(len(e) for e in events))
        cuts = [ends[c % len(ends)] for c in cuts]
    # The full path over the same reads: ahead of an error, a session that holds a stream's first texts back
    # (MindIE, proxy/hub/pipeline.py) has handed on what came in the reads before those texts began, no more.
    full = run(raw, cuts, dialect, full_text, False, model)
    assert run(raw, cuts, dialect, full_text, True, model) == full
    assert run(raw, cuts, dialect, full_text, True, model, runs=True) == full


def test_an_error_finish_reason_still_ends_the_stream_when_the_next_event_fits_the_lane() -> None:
    def event(text: str, finish: str | None = None) -> bytes:
        body = {"id": "x", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}
        return b"data: " + orjson.dumps(body) + b"\n\n"

    raw = b"".join([event(""), event("a"), event("b"), event("", ERROR_FINISH), event("d"), b"data: [DONE]\n\n"])
    with_lane = run(raw, [], "deepseek", False, True)
    assert with_lane == run(raw, [], "deepseek", False, False)
    events, _, error = with_lane
    assert [e.content for e in events] == ["", "a", "b"] and error is not None and "resource" in error.lower()


def test_a_plain_stream_goes_through_the_lane() -> None:
    """The lane is really taken (the property above would also hold if it never matched)."""
    lane = TextLane()
    first = b'{"id":"x","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}'
    lane.learn(first, "content", "a", 0, False)
    assert lane.match(first.replace(b'"a"', '"b \\"q\\" é"'.encode())) == (0, False, 'b "q" é')
    assert lane.match(first.replace(b'"a"', b'""')) is None  # empty text: the full path decides
    assert lane.match(first.replace(b'null}', b'"stop"}')) is None  # another envelope
    assert lane.match(first.replace(b'"a"', b'"a","role":"x"')) is None  # not one string token


def test_a_run_of_lane_events_is_matched_at_once() -> None:
    """One read of a fast stream: the lane takes the events that fit, in order, and stops at the first that does not."""
    lane = TextLane()
    first = b'{"id":"x","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}'
    lane.learn(first, "content", "a", 0, False)

    def text(t: bytes) -> bytes:
        return first.replace(b'"a"', t)

    stop = first.replace(b'null}', b'"stop"}')
    events: list[bytes | SSEEvent] = [stop, text(b'"b"'), text(b'"c"'), text(b'"\\u00e9"'), text(b'""'),
                                      text(b'"d"')]
    assert lane.run(events, 0) is None
    assert lane.run(events, 1) == (0, False, ["b", "c", "é"])  # stops at the empty text
    assert lane.run(events, 5) == (0, False, ["d"])
    assert lane.run([text(b'"b"'), b"[DONE]", text(b'"c"')], 0) == (0, False, ["b"])
    assert lane.run([text(b'"b"'), SSEEvent("x"), text(b'"c"')], 0) == (0, False, ["b"])
    assert lane.run([text(b'"b"'), text(b'"c\xff"'), text(b'"c"')], 0) == (0, False, ["b"])  # invalid UTF-8
    assert lane.run([text(b'"b"'), text(b'1'), text(b'"c"')], 0) == (0, False, ["b"])  # not a string


def test_learning_skips_a_lookalike_inside_another_string() -> None:
    lane = TextLane()
    data = b'{"id":"\\"content\\":\\"a\\"","choices":[{"index":0,"delta":{"content": "a"},"finish_reason":null}]}'
    lane.learn(data, "content", "a", 0, False)
    assert lane.match(data.replace(b'"content": "a"', b'"content": "zz"')) == (0, False, "zz")
    assert lane.match(data.replace(b'\\"a\\"', b'\\"b\\"')) is None


def test_learning_stops_when_events_never_repeat() -> None:
    lane = TextLane()
    for i in range(10):
        lane.learn(f'{{"id":"{i}","choices":[{{"index":0,"delta":{{"content":"a"}}}}]}}'.encode(), "content", "a", 0,
                   False)
    assert lane.match(b'{"id":"9","choices":[{"index":0,"delta":{"content":"b"}}]}') is None  # learned only 4
    assert lane.match(b'{"id":"3","choices":[{"index":0,"delta":{"content":"b"}}]}') == (0, False, "b")


def test_invalid_utf8_in_a_lane_event_is_replaced_as_on_the_full_path() -> None:
    def event(text: bytes) -> bytes:
        return b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"' + text + b'"},"finish_reason":null}]}\n\n'

    end = b'data: {"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    raw = b"".join([event(b""), event(b"a"), event(b"b\xff\xfec"), event(b"d"), end])
    with_lane = run(raw, [], "openai", False, True)
    assert with_lane == run(raw, [], "openai", False, False)
    assert [e.content for e in with_lane[0]][:4] == ["", "a", "b\ufffd\ufffdc", "d"]


def _loads_text(token: bytes) -> str | None:
    """What the lane took from a token before its direct read (proxy/stream/text_lane.py `_text`): orjson's verdict."""
    try:
        value = orjson.loads(token)
    except orjson.JSONDecodeError:
        return None
    return value if value.__class__ is str and value else None


TOKEN_TEXTS = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=["Cs"]),
                      max_size=40) | st.sampled_from(["", "a", "\x00", "\x1f", "\x7f", "\x85", "\u00a0", "\u2028",
                                                      "é", "😀", "x" * 300, '"', "\\", "a\tb"])


@given(TOKEN_TEXTS, st.sampled_from(["orjson", "ascii", "raw", "raw_quoted"]), st.binary(max_size=8),
       st.binary(max_size=3))
@settings(max_examples=600, deadline=None)
def test_a_tokens_text_is_orjsons_verdict(text: str, spelling: str, junk: bytes, pad: bytes) -> None:
    """`_text` reads short plain tokens without orjson: the same value, or None, as orjson gives for any bytes
    (escapes, raw control characters JSON forbids, DEL, invalid UTF-8, quotes inside, long tokens, not a string)."""
    from proxy.stream.text_lane import _text

    if spelling == "orjson":
        token = orjson.dumps(text)
    elif spelling == "ascii":
        token = json.dumps(text).encode()
    elif spelling == "raw":  # the text's UTF-8 between quotes, as is: invalid JSON when it holds a control character
        token = b'"' + text.encode() + b'"'
    else:  # anything between quotes, invalid UTF-8 included
        token = b'"' + junk + text.encode()[:4] + b'"'
    data = pad + token + pad[::-1]
    start, end = len(pad), len(pad) + len(token)
    assert _text(data, start, end, direct=True) == _loads_text(token)  # the compiled build's read, in any build
    assert _text(data, start, end, direct=False) == _loads_text(token)
