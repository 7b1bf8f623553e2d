"""CumulativeText: MindIE fullTextEnabled snapshots -> true deltas."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from proxy.hub.sse import SSEDecoder
from proxy.stream.cumulative import CumulativeText

FFFD = "\ufffd"
FULLTEXT = (Path(__file__).parent.parent / "fixtures" / "mindie" / "stream-fulltext.sse").read_bytes()


def run(snapshots: list[str], final: str | None = None) -> tuple[list[str], str, CumulativeText]:
    ct = CumulativeText()
    deltas = [ct.feed(s) for s in snapshots]
    return deltas, ct.flush(final), ct


def test_mindie_fulltext_transcript() -> None:
    dec = SSEDecoder()
    events = [e for e in dec.feed(FULLTEXT) + dec.flush() if e.data != "[DONE]"]
    chunks = [json.loads(e.data) for e in events]
    ct = CumulativeText()
    deltas = [ct.feed(c["choices"][0]["delta"]["content"]) for c in chunks]
    tail = ct.flush(chunks[-1]["full_text"])
    assert deltas == ["Hello", "!", " How", " can", " I", " assist", " you", " today", "?", ""]
    assert tail == ""
    assert (ct.rewrites, ct.mismatch) == (0, False)


def test_repeated_and_empty_snapshots_give_nothing() -> None:
    deltas, tail, ct = run(["ab", "ab", "", "abc", "abc", ""])
    assert deltas == ["ab", "", "", "c", "", ""]
    assert tail == ""
    assert ct.rewrites == 0  # an empty finishing delta is not a retraction


def test_trailing_fffd_is_held_until_resolved() -> None:
    # "é" is two bytes: the detokeniser shows the first one as U+FFFD, then the real character.
    deltas, tail, ct = run(["caf", "caf" + FFFD, "café", "café " + FFFD + FFFD, "café 🙂"])
    assert deltas == ["caf", "", "é", " ", "🙂"]
    assert tail == ""
    assert FFFD not in "".join(deltas)
    assert ct.rewrites == 0


def test_trailing_fffd_at_the_very_end_is_emitted() -> None:
    deltas, tail, ct = run(["ab", "ab" + FFFD])
    assert deltas == ["ab", ""]
    assert tail == FFFD  # the generation really ended mid-character
    assert ct.mismatch is False


def test_fffd_inside_the_text_is_final() -> None:
    deltas, tail, _ = run(["a" + FFFD + "b"])
    assert deltas == ["a" + FFFD + "b"]
    assert tail == ""


def test_final_full_text_supplies_the_missing_tail() -> None:
    deltas, tail, ct = run(["Hel", "Hello" + FFFD], final="Hello!")
    assert "".join(deltas) + tail == "Hello!"
    assert tail == "!" and ct.mismatch is False


def test_final_full_text_resolving_held_fffd() -> None:
    deltas, tail, ct = run(["ab" + FFFD], final="abç")
    assert deltas == ["ab"] and tail == "ç" and ct.mismatch is False


def test_final_full_text_that_disagrees_is_a_mismatch() -> None:
    # e.g. a stop string trimmed from full_text after it had been streamed: we cannot take it back.
    deltas, tail, ct = run(["Hello", "Hello STOP"], final="Hello")
    assert (deltas, tail, ct.mismatch) == (["Hello", " STOP"], "", True)
    deltas, tail, ct = run(["abc"], final="xbcd")
    assert tail == "d" and ct.mismatch is True  # the client's text stays as long as the upstream's


def test_rewrite_policy_never_sends_a_character_twice() -> None:
    ct = CumulativeText()
    assert ct.feed("Hello wrld") == "Hello wrld"
    assert ct.feed("Hello world") == ""  # the client's "rld" is found in the rewrite: nothing new yet
    assert ct.rewrites == 1
    assert ct.feed("Hello world!") == "!"  # extends the upstream's own text: not another rewrite
    assert ct.rewrites == 1
    assert ct.feed("Hello") == ""  # a retraction is a rewrite too, and sends nothing
    assert ct.feed("Hello world!?") == "?"
    assert ct.rewrites == 2
    assert ct.flush("Hello world!?") == ""
    assert ct.mismatch is True  # the client has "Hello wrld!?": the inserted "o" is lost, nothing is doubled


def test_insertion_rewrite_continues_after_the_clients_text() -> None:
    # The mock's [mock:rewrite]: a length-based rule would give "Hello worrld!".
    deltas, tail, ct = run(["Hello", "Hello wor", "Hello, world", "Hello, world!"])
    assert "".join(deltas) + tail == "Hello world!"
    assert ct.rewrites == 1


def test_same_length_rewrite_leaves_only_the_corrected_span_different() -> None:
    deltas, _, ct = run(["The cat", "The bat sat", "The bat sat down"])
    assert "".join(deltas) == "The cat sat down"
    assert ct.rewrites == 1


def test_flush_without_anything() -> None:
    ct = CumulativeText()
    assert ct.flush() == "" and ct.flush(None) == ""
    assert ct.mismatch is False
    assert CumulativeText().flush("") == ""


def test_flush_is_idempotent() -> None:
    ct = CumulativeText()
    ct.feed("a" + FFFD)
    assert ct.flush() == FFFD
    assert ct.flush() == ""


# -- property: any growing sequence of snapshots reproduces the final text -------------------------------------------

_ALPHABET = st.sampled_from(list("ab \n") + ["é", "你", "好", "🙂", "👍", "\U0001f3fd", "\u200d", "∑"])


@st.composite
def snapshot_streams(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A final text and the snapshots a detokeniser would send: growing prefixes, repeats, and before a prefix
    possibly the same text with its last 1-2 characters still undecoded (shown as 1-3 U+FFFD)."""
    final = draw(st.text(_ALPHABET, min_size=0, max_size=40))
    cuts = sorted(draw(st.lists(st.integers(0, len(final)), max_size=15)))
    snapshots: list[str] = []
    previous = 0
    for cut in cuts:
        pending = draw(st.integers(0, min(2, cut - previous)))
        if pending:
            snapshots.append(final[:cut - pending] + FFFD * draw(st.integers(1, 3)))
        snapshots.append(final[:cut])
        if draw(st.booleans()):
            snapshots.append(final[:cut])
        previous = cut
    if draw(st.booleans()) and final:  # the generation ends mid-character: the last snapshot keeps its U+FFFD
        snapshots.append(final + FFFD)
    return final, snapshots


@settings(max_examples=300, deadline=None)
@given(snapshot_streams(), st.booleans())
def test_deltas_rebuild_the_final_text(stream: tuple[str, list[str]], with_final: bool) -> None:
    final, snapshots = stream
    assume(FFFD not in final)
    ends_in_fffd = bool(snapshots) and snapshots[-1].endswith(FFFD)
    if ends_in_fffd and with_final:
        final = snapshots[-1]  # MindIE's full_text then ends in U+FFFD as well
    ct = CumulativeText()
    emitted: list[str] = []
    for snap in snapshots:
        emitted.append(ct.feed(snap))
        so_far = "".join(emitted)
        assert final.startswith(so_far)  # never a character the client must later unlearn, never a duplicate
        assert FFFD not in so_far  # the alphabet has none: every U+FFFD was a half-decoded character
    emitted.append(ct.flush(final if with_final else None))
    text = "".join(emitted)
    if with_final:
        assert text == final
        assert ct.mismatch is False
    else:
        assert text == (snapshots[-1] if snapshots else "")
    assert text.endswith(FFFD) is ends_in_fffd
    assert ct.rewrites == 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(_ALPHABET, max_size=12), max_size=10), st.text(_ALPHABET, max_size=20))
def test_arbitrary_snapshots_never_make_the_client_text_longer_than_upstream(
    snapshots: list[str], final: str,
) -> None:
    # Rewrites included: whatever the upstream does, the client's text never outgrows the upstream's longest text,
    # and without a rewrite it is exactly the upstream's (extensions reach the client; nothing piles up).
    ct = CumulativeText()
    parts: list[str] = []
    longest = 0
    for snap in snapshots:
        parts.append(ct.feed(snap))
        longest = max(longest, len(snap.rstrip(FFFD)))
        assert len("".join(parts)) <= longest
    parts.append(ct.flush(final))
    text = "".join(parts)
    assert len(text) <= max(longest, len(final))
    assert ct.mismatch is (text != final)
    seen = [snap.rstrip(FFFD) for snap in snapshots if snap]
    if ct.rewrites == 0 and final.startswith(seen[-1] if seen else ""):
        assert text == final


@settings(max_examples=300, deadline=None)
@given(st.text(_ALPHABET, min_size=1, max_size=30), st.data())
def test_a_rewrite_that_inserts_text_never_duplicates(final: str, data: st.DataObject) -> None:
    # The upstream sends a prefix of a slightly different text, then corrects to `final` by inserting characters:
    # the client's text must be a subsequence of `final` (nothing doubled), ending like `final` does.
    cut = data.draw(st.integers(1, len(final)))
    drop = data.draw(st.integers(0, cut - 1))
    early = final[:drop] + final[drop + 1:cut]  # one character of the prefix missing (the later insertion)
    ct = CumulativeText()
    text = ct.feed(early) + ct.feed(final) + ct.flush(final)
    it = iter(final)
    assert all(ch in it for ch in text), (early, final, text)  # text is a subsequence of final


@settings(max_examples=300, deadline=None)
@given(st.one_of(snapshot_streams().map(lambda s: s[1]), st.lists(st.text(_ALPHABET, max_size=12), max_size=10)),
       st.one_of(st.none(), st.text(_ALPHABET, max_size=20)))
def test_fast_lane_is_the_general_path(snapshots: list[str], final: str | None) -> None:
    # The usual snapshot (the previous one extended) takes a fast lane: the same deltas, counts and flush.
    fast, general = CumulativeText(), CumulativeText(fast_lane=False)
    for snap in snapshots:
        assert fast.feed(snap) == general.feed(snap)
        assert fast.rewrites == general.rewrites
    assert fast.flush(final) == general.flush(final)
    assert (fast.rewrites, fast.mismatch) == (general.rewrites, general.mismatch)
