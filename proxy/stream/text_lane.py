"""The text lane: a shortcut for the most common stream event — one choice adding text — that gives exactly the event
the full path would (parse the whole event, upstream session, normaliser) while parsing only the text's own token.

An upstream sends most events of an answer as the same text around one JSON string, e.g.

    {"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"…"},
    "logprobs":null,"finish_reason":null}]}

When the full path has turned such an event into a plain text event, `learn` finds that string's token in the
event's data (its undecoded bytes: proxy/hub/sse.py SSEDecoder.payloads) and keeps what comes before and after it: a
template. A later event that is the same text around another string token is the same JSON with one string
changed; while the session and the normaliser say that text passes through them unchanged (no cumulative text, no
`<think>` splitting, no pending error: proxy/hub/pipeline.py asks them), the full path would give the same event with
that string, so `run` returns the string alone (invalid UTF-8 in it: no match, the full path decides).

Templates are kept per choice and kind (text, reasoning), at most four, relearned when the upstream's envelope
changes; a stream whose events never fit a template stops learning after a few tries (the cost stays bounded).

A read of a fast stream holds many events (16 to a read at zero delay in tests/bench/bench.py): `run` takes the
events that fit one template, one after another, in one call, and the pipeline asks the session and the normaliser
once for the run (a lane event changes neither's state).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import orjson

if TYPE_CHECKING:
    from proxy.hub.sse import SSEEvent  # a type only: the hub imports this part

__all__ = ["TextLane"]

# The probe that proves a token's place: the event with the token swapped for it must carry the probe's value at
# choices[0].delta.<field>.
_PROBE: Final = b'"\\u0000lane"'
_PROBE_VALUE: Final = "\x00lane"
_MAX_TRIES: Final = 4  # learns in a row without a single match in between: the upstream's events do not repeat
# `_text`: tokens up to this long are read directly (a token's text at a time, a few bytes; longer ones, cumulative
# snapshots, go to orjson, whose scan costs less per byte)
_SHORT: Final = 32
_QUOTE: Final = 0x22
_loads: Final = orjson.loads  # (compiled: a static, not a module attribute looked up per call)
# A byte table that changes exactly the bytes a JSON string cannot hold raw: U+0000-U+001F, the quote, the backslash
# (UTF-8 multi-byte sequences hold none of them).
PLAIN: Final = bytes(0xFF if b < 0x20 or b in (0x22, 0x5C) else b for b in range(256))


class TextLane:
    __slots__ = ("_templates", "_tries")

    def __init__(self) -> None:
        # (prefix, suffix, choice index, is reasoning)
        self._templates: list[tuple[bytes, bytes, int, bool]] = []
        self._tries = 0

    def run(self, events: list[bytes | SSEEvent], at: int) -> tuple[int, bool, list[str]] | None:
        """(choice index, is reasoning, texts) for the events of one read from `at` on (a fast upstream's read holds
        many): the texts of `events[at]` and of the events right after it that are the same template around one
        non-empty string, in order. The run stops before the first event that is not (another template, an
        `SSEEvent`, [DONE], an invalid string)."""
        first = events[at]
        if not isinstance(first, bytes):
            return None
        for template in self._templates:
            prefix, suffix, index, reasoning = template
            if len(first) - len(suffix) - len(prefix) >= 2 and first.startswith(prefix) and first.endswith(suffix):
                break
        else:
            return None
        start = len(prefix)
        tail = len(suffix)
        texts: list[str] = []
        for i in range(at, len(events)):
            data = events[i]
            if not isinstance(data, bytes):
                break
            end = len(data) - tail
            if end - start < 2 or not data.startswith(prefix) or not data.endswith(suffix):
                break
            value = _text(data, start, end)
            if not value:
                break
            texts.append(value)
        if not texts:
            return None
        self._tries = 0
        return index, reasoning, texts

    def forget(self) -> None:
        """Drop the templates (the answer's envelope changed since they were learned: proxy/hub/pipeline.py)."""
        self._templates = []

    def learn(self, data: bytes, field: str, value: str | None, index: int, reasoning: bool) -> None:
        """`data` is an event whose only choice, `index`, went through the full path as text `value` taken unchanged
        from its `delta.<field>` (None: a session rewrote it, see UpstreamSession.lane_text; the token is then placed
        by the probe alone): remember the text around that string's token."""
        if self._tries >= _MAX_TRIES:
            return
        self._tries += 1
        key = b'"' + field.encode() + b'":'
        pos = data.find(key)
        while pos != -1:
            start = pos + len(key)
            while data[start:start + 1] in (b" ", b"\t", b"\r", b"\n"):
                start += 1
            end = _string_end(data, start)
            if end is not None and _is_at(data[:start] + _PROBE + data[end:], field, index):
                try:
                    same = value is None or orjson.loads(data[start:end]) == value
                except orjson.JSONDecodeError:
                    same = False
                if same:
                    template = (data[:start], data[end:], index, reasoning)
                    self._templates = [t for t in self._templates if (t[2], t[3]) != (index, reasoning)][-3:]
                    self._templates.append(template)
                    return
            pos = data.find(key, pos + 1)


def _text(data: bytes, start: int, end: int) -> str | None:
    """The value of `data[start:end]` if that is a JSON string token holding text, else None (not JSON, not a
    string, empty). A short token with no byte that JSON escapes inside (a control character, a quote, a backslash:
    `PLAIN` leaves it unchanged, and translate gives back the very object then) is its UTF-8 between the quotes,
    without a call of orjson (a tiny string's parse costs more than the check). Anything else, orjson decides."""
    if end - start <= _SHORT and data[start] == _QUOTE and data[end - 1] == _QUOTE:
        inner = data[start + 1:end - 1]
        if inner.translate(PLAIN) is inner:
            try:
                return inner.decode() or None
            except UnicodeDecodeError:
                pass  # orjson says (it rejects invalid UTF-8 as well)
    try:
        value = _loads(data[start:end])
    except orjson.JSONDecodeError:
        return None
    return value if value.__class__ is str and value else None


def _string_end(data: bytes, start: int) -> int | None:
    """The end (exclusive) of the JSON string token starting at `start`, or None if none starts there."""
    if data[start:start + 1] != b'"':
        return None
    i = start + 1
    while True:
        quote = data.find(b'"', i)
        if quote == -1:
            return None
        backslashes = 0
        j = quote - 1
        while j > start and data[j] == 0x5C:  # a backslash
            backslashes += 1
            j -= 1
        if backslashes % 2 == 0:
            return quote + 1
        i = quote + 1


def _is_at(probe: bytes, field: str, index: int) -> bool:
    try:
        doc = orjson.loads(probe)
        choices = doc["choices"]
        choice = choices[0]
        return bool(
            len(choices) == 1 and (choice.get("index") or 0) == index and choice["delta"][field] == _PROBE_VALUE
        )
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
        return False
