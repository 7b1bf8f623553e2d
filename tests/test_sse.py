"""SSEDecoder: framing, line endings, comments, garbage, and chunk-boundary invariance on MindIE transcripts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.hub.sse import DONE, KEEPALIVE, Event, SSEDecoder, SSEEvent, encode_comment, encode_data, encode_events

FIXTURES = Path(__file__).parent / "fixtures" / "mindie"
DELTAS = (FIXTURES / "stream-deltas.sse").read_bytes()
FULLTEXT = (FIXTURES / "stream-fulltext.sse").read_bytes()


def decode(*chunks: bytes) -> list[SSEEvent]:
    dec = SSEDecoder()
    out: list[SSEEvent] = []
    for chunk in chunks:
        out += dec.feed(chunk)
    return out + dec.flush()


def crlf(raw: bytes) -> bytes:
    return raw.replace(b"\n", b"\r\n")


def lone_cr(raw: bytes) -> bytes:
    return raw.replace(b"\n", b"\r")


# -- the MindIE transcripts ---------------------------------------------------------------------------------------

def test_deltas_transcript_decodes_to_its_events() -> None:
    events = decode(DELTAS)
    assert len(events) == 18
    assert all(e.garbage is None and e.event is None for e in events)
    assert events[-1].data == "[DONE]"
    chunks = [json.loads(e.data) for e in events[:-1]]
    assert [c["choices"][0]["delta"]["content"] for c in chunks][:2] == ["\t", ""]
    assert chunks[-1]["usage"] == {"prompt_tokens": 54, "completion_tokens": 17, "total_tokens": 71}
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_fulltext_transcript_decodes_to_its_events() -> None:
    events = decode(FULLTEXT)
    assert [e.data for e in events][-1] == "[DONE]"
    snapshots = [json.loads(e.data)["choices"][0]["delta"]["content"] for e in events[:-1]]
    assert snapshots[0] == "Hello"
    assert snapshots[-1] == "Hello! How can I assist you today?"
    assert json.loads(events[-2].data)["full_text"] == "Hello! How can I assist you today?"


@pytest.mark.parametrize("name,raw", [
    ("deltas", DELTAS), ("fulltext", FULLTEXT),
    ("deltas-crlf", crlf(DELTAS)), ("fulltext-crlf", crlf(FULLTEXT)),
    ("fulltext-cr", lone_cr(FULLTEXT)),
])
def test_split_at_every_byte_offset_gives_the_same_events(name: str, raw: bytes) -> None:
    whole = decode(raw)
    assert whole == decode(DELTAS if name.startswith("deltas") else FULLTEXT)  # line endings do not matter
    for i in range(len(raw) + 1):
        assert decode(raw[:i], raw[i:]) == whole, f"split at byte {i}"


def test_one_byte_per_read() -> None:
    for raw in (FULLTEXT, crlf(DELTAS), lone_cr(DELTAS)):
        assert decode(*(raw[i:i + 1] for i in range(len(raw)))) == decode(raw)


def test_empty_reads_change_nothing() -> None:
    raw = crlf(FULLTEXT)
    cut = raw.index(b"\r\n") + 1  # between "\r" and "\n", with empty reads in between
    assert decode(b"", raw[:cut], b"", b"", raw[cut:], b"") == decode(raw)


# -- line endings --------------------------------------------------------------------------------------------------

def test_crlf_lf_and_lone_cr_mix() -> None:
    raw = b"data: a\r\n\r\ndata: b\n\ndata: c\r\rdata: d\r\n\n"
    assert [e.data for e in decode(raw)] == ["a", "b", "c", "d"]


def test_cr_at_end_of_read_then_lf_is_one_line_ending() -> None:
    # If the "\n" after a read-final "\r" were taken as a second line ending, "data: b" would be cut off from "a".
    assert [e.data for e in decode(b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n")] == ["a\nb"]


def test_cr_then_cr_is_two_line_endings() -> None:
    assert [e.data for e in decode(b"data: a\r", b"\r", b"data: b\r\r")] == ["a", "b"]


# -- fields ----------------------------------------------------------------------------------------------------------

def test_multi_line_data_is_joined_with_newlines() -> None:
    events = decode(b"data: {\"a\":\ndata: 1}\n\n")
    assert [e.data for e in events] == ['{"a":\n1}']
    assert json.loads(events[0].data) == {"a": 1}


def test_only_one_space_after_the_colon_is_removed() -> None:
    assert [e.data for e in decode(b"data:x\n\ndata:  y\n\ndata\n\n")] == ["x", " y", ""]


def test_event_and_id_fields() -> None:
    events = decode(b"event: error\nid: 7\ndata: {\"error\":{}}\n\ndata: x\n\n")
    assert events[0] == SSEEvent(data='{"error":{}}', event="error", id="7")
    assert events[1].event is None and events[1].data == "x"
    assert events[1].id == "7"  # the last event id persists, as the SSE spec says


def test_retry_field_is_not_garbage() -> None:
    assert decode(b"retry: 3000\ndata: x\n\n") == [SSEEvent(data="x")]


# -- comments --------------------------------------------------------------------------------------------------------

def test_keep_alive_comments_are_ignored() -> None:
    raw = b": keep-alive\n\ndata: a\n\n: keep-alive\n\n:\n\ndata: b\n: inside an event\ndata: c\n\n"
    assert decode(raw) == [SSEEvent(data="a"), SSEEvent(data="b\nc")]


def test_keep_alive_split_everywhere() -> None:
    raw = KEEPALIVE + b"data: a\r\n" + b": ping\r\n\r\n" + KEEPALIVE
    for i in range(len(raw) + 1):
        assert decode(raw[:i], raw[i:]) == [SSEEvent(data="a")]


# -- UTF-8 ----------------------------------------------------------------------------------------------------------

def test_multibyte_utf8_split_at_every_byte() -> None:
    text = "你好，世界 🙂 — ∑ café"
    raw = encode_data(json.dumps({"content": text}, ensure_ascii=False).encode()) + DONE
    assert len(raw) > len(text) + 20  # multi-byte for real
    for i in range(len(raw) + 1):
        for j in range(i, min(len(raw), i + 5) + 1):
            events = decode(raw[:i], raw[i:j], raw[j:])
            assert [e.data for e in events][-1] == "[DONE]"
            assert json.loads(events[0].data)["content"] == text


def test_invalid_utf8_is_replaced_not_raised() -> None:
    assert decode(b"data: a\xffb\n\n") == [SSEEvent(data="a\ufffdb")]


# -- garbage and the end of the stream ------------------------------------------------------------------------------

def test_mindie_engine_timeout_is_reported_as_garbage() -> None:
    # MindIE writes this raw line after the 200 and closes: no "data:", no newline, no [DONE].
    raw = FULLTEXT[: FULLTEXT.index(b"data: [DONE]")] + b"Engine callback timeout: server tokenTimeout"
    events = decode(raw)
    assert events[-1] == SSEEvent(garbage="Engine callback timeout: server tokenTimeout")
    assert all(e.garbage is None for e in events[:-1])
    for i in range(len(raw) - 60, len(raw) + 1):
        assert decode(raw[:i], raw[i:]) == events


def test_garbage_lines_between_events() -> None:
    events = decode(b"data: a\n\n<html>502 Bad Gateway</html>\n\ndata: b\n\n")
    assert events == [SSEEvent(data="a"), SSEEvent(garbage="<html>502 Bad Gateway</html>"), SSEEvent(data="b")]


def test_json_error_body_instead_of_a_stream_is_garbage() -> None:
    events = decode(b'{"error": "Model not found", "error_type": "Input Validation Error"}')
    assert events == [SSEEvent(garbage='{"error": "Model not found", "error_type": "Input Validation Error"}')]


def test_flush_dispatches_an_unterminated_last_line() -> None:
    dec = SSEDecoder()
    assert dec.feed(b"data: a\n\ndata: {\"x\": 1}") == [SSEEvent(data="a")]
    assert dec.flush() == [SSEEvent(data='{"x": 1}')]
    assert dec.flush() == []


def test_flush_dispatches_an_event_without_its_blank_line() -> None:
    dec = SSEDecoder()
    assert dec.feed(b"data: a\r\n") == []
    assert dec.flush() == [SSEEvent(data="a")]


def test_flush_of_nothing() -> None:
    assert SSEDecoder().flush() == []
    assert decode(b"\n\n\r\n") == []


def test_utf8_bom_at_stream_start_is_ignored() -> None:
    # The SSE spec strips one leading BOM; without that the first line would be reported as garbage.
    raw = b"\xef\xbb\xbf" + FULLTEXT
    for i in range(5):
        assert decode(raw[:i], raw[i:]) == decode(FULLTEXT)
    # only at the very start
    assert decode(b"data: a\n\n\xef\xbb\xbfdata: b\n\n")[1].garbage is not None
    # payloads: an empty first read decides nothing; a first read that starts no BOM decides that there is none
    decoder = SSEDecoder()
    assert [decoder.payloads(read) for read in (b"", b"\xef\xbb", b"\xbfdata: a\n\n")] == [[], [], [b"a"]]
    decoder = SSEDecoder()
    assert decoder.payloads(b"data: a\n\ndata: b\n\n") == [b"a", b"b"]
    assert decoder.payloads(b"\xef\xbb\xbfdata: c\n\n")[0].garbage is not None


# -- encoder -------------------------------------------------------------------------------------------------------

def test_encoder_round_trip() -> None:
    raw = encode_data(b'{"a":1}') + encode_comment("keep-alive") + DONE
    assert raw.startswith(b'data: {"a":1}\n\n: keep-alive\n\n')
    assert decode(raw) == [SSEEvent(data='{"a":1}'), SSEEvent(data="[DONE]")]


def test_events_framed_as_sse() -> None:
    """An encoder's events as the HTTP sink frames them: a named event gets its `event:` line, a plain one only
    `data:`; the decoder reads back each name and payload."""
    events = [Event(b"message_start", b'{"type":"message_start"}'), Event(None, b'{"a":1}'), Event(None, b"[DONE]")]
    raw = encode_events(events)
    assert raw == b'event: message_start\ndata: {"type":"message_start"}\n\ndata: {"a":1}\n\ndata: [DONE]\n\n'
    assert decode(raw) == [SSEEvent(data='{"type":"message_start"}', event="message_start"),
                           SSEEvent(data='{"a":1}'), SSEEvent(data="[DONE]")]
    assert encode_events([]) == b""


@given(st.lists(st.tuples(st.sampled_from([None, b"ping", b"content_block_delta", b"message_stop"]),
                          st.binary(min_size=0, max_size=8).filter(lambda b: b"\n" not in b and b"\r" not in b)),
                max_size=8))
def test_events_framed_one_by_one(pairs: list[tuple[bytes | None, bytes]]) -> None:
    """Any run of events, names repeated or alternating (a name equal to the one before but another object too):
    the same bytes as each event framed on its own."""
    events = [Event(None if name is None else bytes(bytearray(name)), data) for name, data in pairs]
    alone = b"".join((b"" if name is None else b"event: " + name + b"\n") + b"data: " + data + b"\n\n"
                     for name, data in pairs)
    assert encode_events(events) == alone


# -- property: any segmentation of a messy stream gives the same events ---------------------------------------------

_PIECES = [
    b"data: {\"a\": \"\xe4\xbd\xa0\xe5\xa5\xbd\"}\n\n", b"data: x\r\n\r\n", b"data: y\r\r", b": keep-alive\n\n",
    b"data: l1\ndata: l2\n\n", b"event: error\ndata: {}\n\n", b"Engine callback timeout\n",
    b"data: \xf0\x9f\x99\x82\r\n\n", b"\r\n", b"data: [DONE]\n\n",
]
_LONG = b"data: " + b"x" * 1100 + b"\n\n"  # longer than the head of a read SSEDecoder.payloads looks at first


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.sampled_from(_PIECES), min_size=1, max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
)
def test_any_segmentation_gives_the_same_events(parts: list[bytes], cuts: list[int]) -> None:
    raw = b"".join(parts)
    bounds = sorted({c % (len(raw) + 1) for c in cuts})
    chunks = [raw[a:b] for a, b in zip([0, *bounds], [*bounds, len(raw)], strict=True)]
    assert decode(*chunks) == decode(raw)


def payloads(*chunks: bytes) -> list[SSEEvent]:
    """SSEDecoder.payloads (the pipeline's fast lane: plain events as undecoded bytes) -> the events `feed` gives,
    their data decoded and the id left out."""
    dec = SSEDecoder()
    out: list[bytes | SSEEvent] = []
    for chunk in chunks:
        out += dec.payloads(chunk)
    out += dec.flush()
    return without_ids([SSEEvent(e.decode("utf-8", "replace")) if isinstance(e, bytes) else e for e in out])


def without_ids(events: list[SSEEvent]) -> list[SSEEvent]:
    return [SSEEvent(e.data, e.event, None, e.garbage) for e in events]


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.sampled_from([*_PIECES, b"data: {}\n\n", b"id: 7\n", b"data: \xff\n\n", b"\xef\xbb\xbf", _LONG]),
                   min_size=1, max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
    whole_events=st.booleans(),
    groups=st.lists(st.integers(min_value=1, max_value=6), max_size=12),
)
def test_payloads_give_the_events_of_feed(parts: list[bytes], cuts: list[int], whole_events: bool,
                                          groups: list[int]) -> None:
    raw = b"".join(parts)
    expected = without_ids(decode(raw))
    if whole_events:  # one piece per read: the usual paced stream, where the fast lane applies
        assert payloads(*parts) == expected
    # Several whole pieces per read (a fast stream), where the several-events fast lane applies.
    reads, i = [], 0
    for n in [*groups, len(parts)]:
        reads.append(b"".join(parts[i:i + n]))
        i += n
    assert payloads(*reads) == expected
    bounds = sorted({c % (len(raw) + 1) for c in cuts})
    chunks = [raw[a:b] for a, b in zip([0, *bounds], [*bounds, len(raw)], strict=True)]
    assert payloads(*chunks) == expected


def test_a_whole_plain_event_comes_undecoded() -> None:
    dec = SSEDecoder()
    assert dec.payloads(b"data: {\"a\": 1}\n\n") == [b'{"a": 1}']
    assert dec.payloads(b"data: \xe4\xbd\n\n") == [b"\xe4\xbd"]  # the pipeline's JSON parser checks the UTF-8
    assert dec.payloads(b"event: error\ndata: {}\n\n") == [SSEEvent("{}", "error")]
    assert dec.payloads(b"data: a\n") == []
    assert dec.payloads(b"\ndata: b\n\n") == [SSEEvent("a"), b"b"]


def test_a_read_of_whole_plain_events_comes_undecoded() -> None:
    assert SSEDecoder().payloads(b"data: {}\n\ndata: [1]\n\ndata: \n\n") == [b"{}", b"[1]", b""]
    # any other line in the read: the general loop, in order
    assert SSEDecoder().payloads(b"data: {}\n\n: keep-alive\n\ndata: 2\n\n") == [b"{}", b"2"]
    assert SSEDecoder().payloads(b"data: a\ndata: b\n\ndata: c\n\n") == [SSEEvent("a\nb"), b"c"]
    assert SSEDecoder().payloads(b"data: a\n\ndata:b\n\n") == [b"a", SSEEvent("b")]
    # a first event longer than the head looked at first, alone or with others; an event of two data lines
    long = b"y" * 1100
    assert SSEDecoder().payloads(b"data: " + long + b"\n\n") == [long]
    assert SSEDecoder().payloads(b"data: " + long + b"\n\ndata: z\n\n") == [long, b"z"]
    assert SSEDecoder().payloads(b"data: z\n\ndata: " + long + b"\n\n") == [b"z", long]
    assert SSEDecoder().payloads(b"data: " + long + b"\ndata: z\n\n") == [SSEEvent(long.decode() + "\nz")]
