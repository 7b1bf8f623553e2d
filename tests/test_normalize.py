"""The normaliser's answer facts and plain text events: envelope fields in their first order with their latest value,
and a chunk that only adds text to a started choice gives a plain Delta."""

from __future__ import annotations

from proxy.hub.canonical import CHAT
from proxy.hub.events import Answer, Delta
from proxy.hub.normalize import Normalizer


def test_envelope_fields_keep_their_first_order_and_latest_value() -> None:
    answer = Answer()
    normalizer = Normalizer(CHAT, "auto", False, answer)
    normalizer.feed({"b": 1, "choices": [], "a": 1})
    normalizer.feed({"a": 2, "choices": [], "b": 2})
    normalizer.feed({"c": 3, "choices": []})
    assert list(answer.envelope_extra.items()) == [("b", 2), ("a", 2), ("c", 3)]


def test_text_chunks_after_the_first_give_plain_deltas() -> None:
    answer = Answer()
    normalizer = Normalizer(CHAT, "auto", False, answer)
    first = normalizer.feed({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    assert [(d.first, d.content) for d in first] == [(True, "")]
    assert normalizer.feed({"choices": [{"index": 0, "delta": {"content": "Hi"}}]}) == [Delta(0, "", "Hi")]
    assert normalizer.feed({"choices": [{"index": 0, "delta": {"role": "assistant", "content": " there"}}]}) == [
        Delta(0, "", " there")]
