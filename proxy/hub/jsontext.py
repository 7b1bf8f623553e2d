"""JSON string tokens of text on the streams' hot paths: what `orjson.dumps(text)` gives, byte for byte, made
without orjson for text that JSON needs no escape in (the usual token's text).

orjson escapes exactly the quote, the backslash and U+0000-U+001F, writes everything else as its UTF-8 and refuses
lone surrogates. A text whose UTF-8 holds none of those bytes (`PLAIN` leaves it unchanged: `translate` then gives
back the very object) is that UTF-8 between two quotes. Anything else goes to orjson, which escapes it or raises as
it always did. Why: orjson serialises a short string into a fresh 1 KiB buffer it then shrinks, several times what
an encode and a table check cost (docs/speed.md).

The client encoders write one event per token: `dumps_joined` gives the tokens of a run of texts with the bytes
between two events, in one piece (proxy/clients/chat.py, proxy/clients/messages_encoder.py); `dumps_text` one.
"""

from __future__ import annotations

from typing import Final

import orjson

from proxy.build import BUILD
from proxy.stream.jsonplain import PLAIN

__all__ = ["PLAIN", "dumps_joined", "dumps_text"]

_dumps: Final = orjson.dumps  # (compiled: a static, not a module attribute looked up per call)
_QUOTE: Final = b'"'
_NATIVE: Final = BUILD == "mypyc"
_SHORT: Final = 32  # bytes: `dumps_text` checks a text up to this long byte by byte


def dumps_text(text: str) -> bytes:
    """`orjson.dumps(text)`. Compiled, a token's few bytes are checked in a loop of C comparisons (`translate`
    allocates a result before it finds it unchanged) and quoted in one new bytes object;
    interpreted, that loop would cost more than orjson, which does it all."""
    if not _NATIVE:
        return _dumps(text)
    try:
        raw = text.encode()
    except UnicodeEncodeError:  # a lone surrogate: orjson says what it says of one
        return _dumps(text)
    if len(raw) > _SHORT:  # a long text: the C loop of `translate`, as `dumps_joined`
        return _QUOTE + raw + _QUOTE if raw.translate(PLAIN) is raw else _dumps(text)
    for i in range(len(raw)):
        b = raw[i]
        if b < 0x20 or b == 0x22 or b == 0x5C:  # a control character, a quote, a backslash: escaped
            return _dumps(text)
    return b'"%s"' % raw


def dumps_joined(texts: list[str], sep: bytes, before: bytes = b"", after: bytes = b"") -> bytes:
    """`before + sep.join([orjson.dumps(text) for text in texts]) + after`. When no text needs an escape: their
    UTF-8 joined by quote + sep + quote, `before` and a quote put on the first, a quote and `after` on the last (one
    check of all texts, no bytes object per text but its UTF-8, the run's bytes copied once)."""
    if not texts:
        return before + after
    try:
        raws = [text.encode() for text in texts]
    except UnicodeEncodeError:
        return before + sep.join([_dumps(text) for text in texts]) + after
    whole = b"".join(raws)  # the texts' bytes alone, for one check (the joined tokens hold quotes)
    if whole.translate(PLAIN) is not whole:
        return before + sep.join([_dumps(text) for text in texts]) + after
    raws[0] = before + _QUOTE + raws[0]
    raws[-1] = raws[-1] + _QUOTE + after
    return (_QUOTE + sep + _QUOTE).join(raws)
