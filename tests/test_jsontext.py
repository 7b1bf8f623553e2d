"""proxy/hub/jsontext.py: the JSON string tokens it makes without orjson are orjson's own bytes, for any text (escapes,
control characters, non-ASCII, lone surrogates: orjson's error), one by one and joined."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.hub.jsontext import dumps_joined, dumps_text

# Text the direct path takes (plain ASCII and multi-byte), text it must leave to orjson (quotes, backslashes,
# control characters), and text orjson refuses (lone surrogates).
text = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters='"\\'), max_size=12),
    st.text(max_size=12),
    st.text(alphabet=st.sampled_from(['"', "\\", "\n", "\x00", "\x1f", "\x7f", "é", "😀", "\u2028", "a"]),
            max_size=6),
    st.text(min_size=20, max_size=80),  # beyond the byte-by-byte check's length
)
with_surrogates = st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=2)
sep = st.sampled_from([b"", b"},{", b'"}}]}\n\ndata: {"a":', b"\\"])


def orjson_or_error(texts: list[str], joiner: bytes) -> bytes | type[Exception]:
    try:
        return joiner.join([orjson.dumps(t) for t in texts])
    except orjson.JSONEncodeError:
        return orjson.JSONEncodeError


@settings(max_examples=400, deadline=None)
@given(t=text)
def test_dumps_text_is_orjson(t: str) -> None:
    assert dumps_text(t) == orjson.dumps(t)


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(text, max_size=8), joiner=sep, before=sep, after=sep)
def test_dumps_joined_is_orjson_joined(texts: list[str], joiner: bytes, before: bytes, after: bytes) -> None:
    assert dumps_joined(texts, joiner) == joiner.join([orjson.dumps(t) for t in texts])
    assert dumps_joined(texts, joiner, before, after) == before + joiner.join([orjson.dumps(t) for t in texts]) + after


@settings(max_examples=100, deadline=None)
@given(texts=st.lists(st.one_of(text, with_surrogates), min_size=1, max_size=4), joiner=sep)
def test_lone_surrogates_raise_as_orjson_does(texts: list[str], joiner: bytes) -> None:
    want = orjson_or_error(texts, joiner)
    if want is orjson.JSONEncodeError:
        with pytest.raises(orjson.JSONEncodeError):
            dumps_joined(texts, joiner)
    else:
        assert dumps_joined(texts, joiner) == want
    for t in texts:
        if orjson_or_error([t], b"") is orjson.JSONEncodeError:
            with pytest.raises(orjson.JSONEncodeError):
                dumps_text(t)


def test_typical_tokens() -> None:
    assert dumps_text("Hello") == b'"Hello"'
    assert dumps_text(" wörld") == ' wörld'.join(['"', '"']).encode()
    assert dumps_text('say "hi"\n') == b'"say \\"hi\\"\\n"'
    assert dumps_joined(["a", "b"], b",") == b'"a","b"'
    assert dumps_joined(["a", "\t"], b",") == b'"a","\\t"'
    assert dumps_joined([], b",") == b""
    assert dumps_joined(["a", "b"], b"},{", b"[{", b"}]") == b'[{"a"},{"b"}]'
