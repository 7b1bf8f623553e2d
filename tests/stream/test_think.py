"""ThinkSplitter: inline <think>…</think> -> reasoning / content, whatever the chunk boundaries."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from proxy.stream.think import ThinkSplitter

CLOSE = "</think>"


def split(chunks: list[str], start_in_reasoning: bool) -> tuple[str, str, list[tuple[str, str]]]:
    sp = ThinkSplitter(start_in_reasoning)
    pieces: list[tuple[str, str]] = []
    for chunk in chunks:
        pieces += sp.feed(chunk)
    pieces += sp.flush()
    assert all(kind in ("reasoning", "content") and text for kind, text in pieces), pieces
    reasoning = "".join(t for k, t in pieces if k == "reasoning")
    content = "".join(t for k, t in pieces if k == "content")
    return reasoning, content, pieces


def every_two_way_split(text: str, start_in_reasoning: bool) -> tuple[str, str]:
    whole = split([text], start_in_reasoning)[:2]
    for i in range(len(text) + 1):
        assert split([text[:i], text[i:]], start_in_reasoning)[:2] == whole, f"cut at {i}"
    assert split(list(text), start_in_reasoning)[:2] == whole
    return whole


# -- without start_in_reasoning --------------------------------------------------------------------------------------

def test_block_at_start_is_reasoning_and_whitespace_after_close_is_dropped() -> None:
    text = "<think>\nLet me think.\n</think>\n\nThe answer is 4."
    assert every_two_way_split(text, False) == ("\nLet me think.\n", "The answer is 4.")


def test_leading_whitespace_before_the_opening_tag_is_allowed() -> None:
    assert every_two_way_split(" \n\t<think>r</think>c", False) == ("r", "c")


def test_no_tag_means_content_as_sent_leading_whitespace_included() -> None:
    assert every_two_way_split("\n\n  Hello <b>world</b>", False) == ("", "\n\n  Hello <b>world</b>")


def test_later_think_tag_is_plain_content() -> None:
    text = "Use the <think> tag like this: <think>x</think> done"
    assert every_two_way_split(text, False) == ("", text)


def test_close_without_open_is_left_in_the_content() -> None:
    text = "reasoning?</think>\n\nanswer"
    assert every_two_way_split(text, False) == ("", text)


def test_second_block_after_content_is_content() -> None:
    assert every_two_way_split("<think>a</think>b <think>c</think>", False) == ("a", "b <think>c</think>")


def test_stream_ending_inside_the_block_is_all_reasoning() -> None:
    assert every_two_way_split("<think>still thinking </thi", False) == ("still thinking </thi", "")


def test_whitespace_only_or_partial_tag_at_end_is_content() -> None:
    assert split(["  \n"], False)[:2] == ("", "  \n")
    assert split(["\n<thi"], False)[:2] == ("", "\n<thi")
    assert split(["<think"], False)[:2] == ("", "<think")


def test_empty_block_and_whitespace_only_content() -> None:
    assert every_two_way_split("<think></think>", False) == ("", "")
    assert every_two_way_split("<think>r</think>\n\n \n", False) == ("r", "")


def test_whitespace_after_close_stripped_across_later_feeds() -> None:
    r, c, pieces = split(["<think>r</think>", "\n", "\n", "  ", "Answer\n\nmore"], False)
    assert (r, c) == ("r", "Answer\n\nmore")
    assert pieces == [("reasoning", "r"), ("content", "Answer\n\nmore")]


def test_content_whitespace_after_the_first_content_character_is_kept() -> None:
    sp = ThinkSplitter(False)
    out = sp.feed("<think>r</think>\n\nA") + sp.feed("\n\n") + sp.feed(" B") + sp.flush()
    assert out == [("reasoning", "r"), ("content", "A"), ("content", "\n\n"), ("content", " B")]


# -- with start_in_reasoning (DeepSeek-R1 templates put <think> in the prompt) ---------------------------------------

def test_r1_lone_close_tag_splits() -> None:
    text = "Okay, the user asks 2+2.\n</think>\n\n2 + 2 = 4"
    assert every_two_way_split(text, True) == ("Okay, the user asks 2+2.\n", "2 + 2 = 4")


def test_r1_explicit_opening_tag_is_consumed() -> None:
    assert every_two_way_split("\n<think>\nhmm</think>ok", True) == ("\nhmm", "ok")


def test_r1_later_opening_tag_is_reasoning_text() -> None:
    assert every_two_way_split("a <think> b</think>c", True) == ("a <think> b", "c")


def test_r1_leading_whitespace_without_tag_is_reasoning() -> None:
    assert every_two_way_split("\n\nhmm</think>ok", True) == ("\n\nhmm", "ok")


def test_r1_stream_ending_inside_the_block_is_all_reasoning() -> None:
    assert every_two_way_split("no closing tag at all <", True) == ("no closing tag at all <", "")
    assert split(["  "], True)[:2] == ("  ", "")
    assert split(["<thi"], True)[:2] == ("<thi", "")


def test_r1_second_close_tag_is_content() -> None:
    assert every_two_way_split("a</think>b</think>c", True) == ("a", "b</think>c")


# -- latency: hold back only what could still be a tag --------------------------------------------------------------

def test_split_tags_are_held_only_while_ambiguous() -> None:
    sp = ThinkSplitter(False)
    assert sp.feed("\n") == []  # could be followed by <think>
    assert sp.feed("<th") == []
    assert sp.feed("ink>") == []
    assert sp.feed("abc<") == [("reasoning", "abc")]
    assert sp.feed("/thi") == []
    assert sp.feed("nk") == []
    assert sp.feed("X") == [("reasoning", "</thinkX")]  # it was not a tag after all
    assert sp.feed("</think") == []
    assert sp.feed(">\n") == []
    assert sp.feed("\nHi") == [("content", "Hi")]
    assert sp.feed("<") == [("content", "<")]  # content is never held
    assert sp.flush() == []


def test_undecided_start_is_released_as_soon_as_it_is_not_a_tag() -> None:
    sp = ThinkSplitter(False)
    assert sp.feed("  <thin") == []
    assert sp.feed("g") == [("content", "  <thing")]


def _held_suffix(text: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of "</think>"."""
    return max((k for k in range(1, len(CLOSE)) if text.endswith(CLOSE[:k])), default=0)


_REASONING_CHARS = st.sampled_from(["<", "/", "t", "h", "i", "n", "k", ">", "</", "</th", "</think", " ", "a", "思"])


@settings(max_examples=200, deadline=None)
@given(st.lists(_REASONING_CHARS, min_size=1, max_size=30), st.booleans())
def test_reasoning_is_released_except_a_possible_tag_start(tokens: list[str], r1: bool) -> None:
    body = "".join(tokens)
    assume(CLOSE not in body)
    sp = ThinkSplitter(r1)
    sent = "".join(t for _, t in sp.feed("<think>"))
    assert sent == ""
    for i, ch in enumerate(body):
        out = sp.feed(ch)
        assert all(k == "reasoning" for k, _ in out)
        sent += "".join(t for _, t in out)
        seen = body[: i + 1]
        assert sent == seen[: len(seen) - _held_suffix(seen)]


# -- property: chunk-boundary invariance ----------------------------------------------------------------------------

_TOKENS = st.sampled_from(
    ["a", "b", " ", "\n", "\t", "<", ">", "/", "think", "<think>", "</think>", "<th", "ink>", "</", "思", "🙂", "é"]
)
_WS = st.text(st.sampled_from(" \n\t\r"), max_size=3)


def _cuts(text: str, data: st.DataObject) -> list[str]:
    bounds = sorted(set(data.draw(st.lists(st.integers(0, len(text)), max_size=10))))
    return [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)], strict=True)]


@settings(max_examples=300, deadline=None)
@given(
    lead=_WS, opened=st.booleans(), closed=st.booleans(), gap=_WS,
    reasoning=st.lists(_TOKENS, max_size=12).map("".join),
    content=st.lists(_TOKENS, max_size=12).map("".join),
    r1=st.booleans(), data=st.data(),
)
def test_any_cuts_give_the_same_reasoning_and_content(
    lead: str, opened: bool, closed: bool, gap: str, reasoning: str, content: str, r1: bool, data: st.DataObject,
) -> None:
    assume(CLOSE not in reasoning)
    assume(not content[:1].isspace())
    if not opened:  # otherwise the reasoning itself would open the block
        assume(not (lead + reasoning).lstrip().startswith("<think>"))
    text = lead + ("<think>" if opened else "") + reasoning + ((CLOSE + gap + content) if closed else "")

    if opened or r1:
        body = reasoning if opened else lead + reasoning
        expected = (body, content if closed else "")
    else:
        expected = ("", text)  # no opening tag at the start: all of it is content, tags and whitespace included

    assert split([text], r1)[:2] == expected
    assert split(_cuts(text, data), r1)[:2] == expected
