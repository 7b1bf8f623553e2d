"""The normaliser's fast lane (a chunk that only adds text to a started choice) against its general path: the same
events and the same answer facts for any sequence of canonical chunks, chat or completions, any reasoning source."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.errors import StreamTruncated
from proxy.hub.canonical import CHAT, COMPLETIONS
from proxy.hub.events import Answer, Delta
from proxy.hub.normalize import Normalizer


def general_path(kind: str, source: str, starts: bool, answer: Answer) -> Normalizer:
    return Normalizer(kind, source, starts, answer, fast_lane=False)


TEXT = st.one_of(
    st.sampled_from(["", "a", " b", "<think>", "</think>", "\n\n", "<thi", "nk>x", "é😀"]),
    st.text(alphabet=st.sampled_from(["a", " ", "<", ">", "/", "t", "\n", "é"]), max_size=8),
)
OPTIONAL_TEXT = st.one_of(st.none(), TEXT)
DELTA: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries({}, optional={
    "role": st.just("assistant"),
    "content": st.one_of(TEXT, st.none(), st.just(7)),
    "reasoning_content": OPTIONAL_TEXT,
    "reasoning": OPTIONAL_TEXT,
    "tool_calls": st.one_of(st.none(), st.just([]), st.just([{"index": 0, "id": "call_1", "type": "function",
                                                               "function": {"name": "f", "arguments": "{"}}])),
    "refusal": st.none(),
})
CHOICE: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries({}, optional={
    "index": st.sampled_from([0, 0, 0, 1, None]),
    "delta": st.one_of(DELTA, st.just({}), st.none()),
    "text": OPTIONAL_TEXT,
    "finish_reason": st.one_of(st.none(), st.none(), st.sampled_from(["stop", "length"])),
    "logprobs": st.one_of(st.none(), st.just({"content": []})),
    "stop_reason": st.none(),
})
CHUNK = st.fixed_dictionaries({"choices": st.lists(CHOICE, max_size=2)}, optional={
    "id": st.sampled_from(["", "up-1", "up-2"]),
    "object": st.just("chat.completion.chunk"),
    "system_fingerprint": st.sampled_from(["fp_1", "fp_2"]),
    "x_vendor": st.integers(0, 2),
    "usage": st.one_of(st.none(), st.just({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5})),
})
# Mostly plain text chunks, so that long runs of them (the fast lane) follow the other kinds.
PLAIN = st.builds(lambda text, index, role: {"id": "up-1", "system_fingerprint": "fp_1", "choices": [
    {"index": index, "delta": {"role": "assistant", "content": text} if role else {"content": text}, "logprobs": None,
     "finish_reason": None, "text": text}]}, TEXT, st.sampled_from([0, 0, 1]), st.booleans())
CHUNKS = st.lists(st.one_of(PLAIN, PLAIN, CHUNK), max_size=16)


def run(make: Callable[[str, str, bool, Answer], Normalizer], chunks: list[dict[str, Any]], kind: str, source: str,
        starts: bool, final_last: bool) -> tuple[list[Any], Answer]:
    answer = Answer()
    normalizer = make(kind, source, starts, answer)
    out: list[Any] = []
    for n, chunk in enumerate(copy.deepcopy(chunks)):
        final = final_last and n == len(chunks) - 1
        try:
            events: list[Delta] | str = normalizer.feed(chunk, final)
        except Exception as e:  # a shape the hub does not expect: both paths must fail alike
            events = type(e).__name__
        out.append(events)
        out.append(copy.deepcopy(answer))
    try:
        normalizer.finish(True)
        out.append("finished")
    except StreamTruncated as e:
        out.append(e.message)
    return out, answer


@settings(max_examples=400, deadline=None)
@given(chunks=CHUNKS, kind=st.sampled_from([CHAT, CHAT, COMPLETIONS]),
       source=st.sampled_from(["auto", "tags", "field", "none"]), starts=st.booleans(), final_last=st.booleans())
def test_fast_lane_is_the_general_path(chunks: list[dict[str, Any]], kind: str, source: str, starts: bool,
                                       final_last: bool) -> None:
    fast, fast_answer = run(Normalizer, chunks, kind, source, starts, final_last)
    general, general_answer = run(general_path, chunks, kind, source, starts, final_last)
    assert fast == general
    assert list(fast_answer.envelope_extra.items()) == list(general_answer.envelope_extra.items())  # same order


def test_envelope_fields_keep_their_first_order_and_latest_value() -> None:
    answer = Answer()
    normalizer = Normalizer(CHAT, "auto", False, answer)
    normalizer.feed({"b": 1, "choices": [], "a": 1})
    normalizer.feed({"a": 2, "choices": [], "b": 2})
    normalizer.feed({"c": 3, "choices": []})
    assert list(answer.envelope_extra.items()) == [("b", 2), ("a", 2), ("c", 3)]


def test_text_chunks_after_the_first_take_the_fast_lane_and_give_plain_deltas() -> None:
    answer = Answer()
    normalizer = Normalizer(CHAT, "auto", False, answer)
    first = normalizer.feed({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    assert [(d.first, d.content) for d in first] == [(True, "")]
    assert normalizer.feed({"choices": [{"index": 0, "delta": {"content": "Hi"}}]}) == [Delta(0, "", "Hi")]
    assert normalizer.feed({"choices": [{"index": 0, "delta": {"role": "assistant", "content": " there"}}]}) == [
        Delta(0, "", " there")]
