"""The Chat/Completions encoder's hot path (cached envelope bytes around one dumped string) against its general path
(the whole chunk built as a dict and dumped): byte for byte the same, for any sequence of events and any client
setting; and the envelope follows fields that appear mid-stream."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.clients.chat import ChatEncoder, chat_encoder
from proxy.hub.canonical import CHAT, COMPLETIONS, RequestContext
from proxy.hub.events import Answer, Delta
from proxy.hub.sse import encode_events
from proxy.settings import UpstreamSettings

REASONING_MODES = ["reasoning_content", "reasoning", "think_tags", "none"]
TEXT = st.text(alphabet=st.sampled_from(["a", " ", "é", "\n", '"', "\\", "<", "😀", "\x00", "\u2028"]), max_size=6)

ANY_DELTA = st.builds(
    Delta,
    index=st.integers(0, 2),
    reasoning=TEXT,
    content=TEXT,
    tool_calls=st.one_of(st.none(), st.just([{"index": 0, "function": {"arguments": "{}"}}])),
    finish_reason=st.one_of(st.none(), st.sampled_from(["stop", "length"])),
    logprobs=st.one_of(st.none(), st.just({"content": []})),
    extra=st.one_of(st.none(), st.just({"refusal": None})),
    choice_extra=st.one_of(st.none(), st.just({"stop_reason": 7})),
    first=st.booleans(),
)
# Most events only add text: make those common, so that sequences mix them with the rest.
DELTAS = st.one_of(st.builds(Delta, index=st.integers(0, 2), reasoning=TEXT, content=TEXT), ANY_DELTA)
# Envelope fields the upstream adds (system_fingerprint ...), possibly changing mid-stream: (event number, fields).
EXTRAS = st.lists(st.tuples(st.integers(0, 20), st.dictionaries(st.sampled_from(["system_fingerprint", "x"]),
                                                                 st.one_of(st.text(max_size=3), st.none()))),
                  max_size=3)


def encoder(kind: str, include_usage: bool, reasoning: str, answer: Answer, keep_upstream_id: bool,
            stream: bool = True) -> ChatEncoder:
    upstream = UpstreamSettings(name="u", dialect="openai", url="http://127.0.0.1:1", keep_upstream_id=keep_upstream_id)
    ctx = RequestContext(kind=kind, request_id="r", client_model="alias", upstream_model="m", upstream=upstream,
                         stream=stream, response_id="chatcmpl-ours", created=7)
    return chat_encoder(ctx, answer, stream, include_usage, reasoning, None, kind == CHAT)


def in_batches(events: list[Any], batch: int, extras: list[tuple[int, dict[str, Any]]], answers: list[Answer],
               feeds: list[Callable[[list[Any]], bytes]]) -> list[bytes]:
    """Each `feeds[i]`'s output for `events` in groups of `batch`, the `extras` entering every answer's envelope
    before the event they name."""
    outs = [b""] * len(feeds)
    for start in range(0, len(events), batch):
        for at, fields in extras:
            if at == start:
                for answer in answers:
                    answer.envelope_extra.update(fields)
        group = events[start:start + batch]
        outs = [out + feed(group) for out, feed in zip(outs, feeds, strict=True)]
    return outs


def general(enc: ChatEncoder, group: list[Any]) -> bytes:
    """The general path's chunks for these events, one each, as the HTTP sink frames them."""
    for d in group:
        enc._general(d)
    return encode_events(enc.sink.take())


@settings(max_examples=300, deadline=None)
@given(deltas=st.lists(DELTAS, max_size=20), kind=st.sampled_from([CHAT, COMPLETIONS]), include_usage=st.booleans(),
       reasoning=st.sampled_from(REASONING_MODES), extras=EXTRAS, batch=st.integers(1, 4),
       keep_upstream_id=st.booleans())
def test_hot_path_is_the_general_path(deltas: list[Delta], kind: str, include_usage: bool, reasoning: str,
                                      extras: list[tuple[int, dict[str, Any]]], batch: int,
                                      keep_upstream_id: bool) -> None:
    fast_answer, slow_answer = Answer(upstream_id="up-1"), Answer(upstream_id="up-1")
    fast = encoder(kind, include_usage, reasoning, fast_answer, keep_upstream_id)
    slow = encoder(kind, include_usage, reasoning, slow_answer, keep_upstream_id)
    fast_out, slow_out = in_batches(deltas, batch, extras, [fast_answer, slow_answer],
                                    [lambda group: encode_events(fast.feed(group)), lambda group: general(slow, group)])
    assert fast_out == slow_out


def test_hot_path_chunks_parse_as_chat_chunks() -> None:
    answer = Answer()
    enc = encoder(CHAT, True, "reasoning_content", answer, False)
    out = enc.feed([Delta(0, "", "", first=True), Delta(0, "hm", ""), Delta(0, "", 'say "hi"')])
    answer.envelope_extra["system_fingerprint"] = "fp_1"
    out += enc.feed([Delta(1, "", "é\n")])
    assert all(event.name is None for event in out)  # plain `data:` events
    chunks = [orjson.loads(event.data) for event in out]
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""}, {"reasoning_content": "hm"}, {"content": 'say "hi"'}, {"content": "é\n"}]
    assert [c["choices"][0]["index"] for c in chunks] == [0, 0, 0, 1]
    assert all(c["id"] == "chatcmpl-ours" and c["model"] == "alias" and c["usage"] is None for c in chunks)
    assert [c.get("system_fingerprint") for c in chunks] == [None, None, None, "fp_1"]


def test_non_stream_message_has_refusal_and_annotations() -> None:
    """OpenAI's schema requires `refusal` (nullable) on a message, and OpenAI always sends `annotations`: null and []
    where the upstream gave none; an upstream's own values are kept."""
    def message(extra: dict[str, Any] | None) -> dict[str, Any]:
        enc = encoder(CHAT, False, "reasoning_content", Answer(), False, stream=False)
        enc.feed([Delta(index=0, content="" if extra else "hi", extra=extra, first=True),
                  Delta(index=0, finish_reason="stop")])
        (whole,) = enc.finish()
        out: dict[str, Any] = orjson.loads(whole.data)["choices"][0]["message"]
        return out

    assert message(None) == {"role": "assistant", "content": "hi", "refusal": None, "annotations": []}
    refused = message({"refusal": "I can't help with that.", "annotations": [{"type": "url_citation"}]})
    assert refused["refusal"] == "I can't help with that." and refused["content"] is None
    assert refused["annotations"] == [{"type": "url_citation"}]
