"""Cumulative snapshots -> true deltas (MindIE `fullTextEnabled`).

With `fullTextEnabled=true` every MindIE delta's `content` is the whole text generated so far, and the finishing chunk
repeats it in a top-level `full_text`. `CumulativeText.feed(snapshot)` returns only what is new.

Half-decoded characters. The detokeniser renders an incomplete multi-byte character as U+FFFD and replaces it in a
later snapshot once the remaining bytes arrive. A trailing run of U+FFFD is therefore held back until a later snapshot
shows what it became; a U+FFFD inside the text (followed by more text) is final and passes through. At `flush()` a
trailing U+FFFD that was never resolved *is* emitted: the generation really ended mid-character.

Empty snapshots carry no information (MindIE's finishing chunk may have an empty delta) and are ignored.

Rewrites. A snapshot that contradicts the upstream's own previous snapshot (it does not start with it) is a
rewrite; each one is counted in `rewrites` for the metrics layer. The client already holds what we emitted and SSE
cannot take it back, so the policy is: **emitted text is final, and no character is ever sent twice**. After a
rewrite we look for where the client's text ends in the new snapshot — the part of the client's text that diverged
from the new snapshot, searched for in it — and continue from there: "Hello wor" then "Hello, world" sends "ld"
(the client reads "Hello world", missing the inserted comma, rather than "Hello worrld"). When that part cannot be
found (a same-length correction such as "The cat" -> "The bat"), we continue from the same length, so the client's
text never outgrows the upstream's and only the corrected span differs. A retraction (a shorter snapshot) sends
nothing. Any disagreement that remains is visible at `flush()` as `mismatch`.

`flush(final)` treats MindIE's `full_text` as the last, authoritative snapshot (nothing held back), returns whatever
the client is still missing, and sets `mismatch` when the client's text does not equal `final`.
"""

from __future__ import annotations

from typing import Final

__all__ = ["EXTENDING", "FORM_TEXTS", "NOT_EXTENDING", "CumulativeText", "StreamForm"]

_FFFD: Final = "\ufffd"


class CumulativeText:
    """One choice's cumulative text. `feed(snapshot) -> delta`, `flush(final=None) -> delta`."""

    __slots__ = ("_consumed", "_fast_lane", "_parts", "_raw", "_upstream", "mismatch", "rewrites")

    def __init__(self, fast_lane: bool = True) -> None:
        self._fast_lane = fast_lane  # False: every snapshot takes the general path (tests compare the two)
        self._upstream = ""  # the last snapshot without its trailing U+FFFD run
        self._raw = ""  # the last non-empty snapshot as received
        self._consumed = ""  # the upstream text that the client's text corresponds to
        self._parts: list[str] = []  # what the client holds, in pieces (joined only at flush)
        self.rewrites = 0
        self.mismatch = False

    def feed(self, snapshot: str) -> str:
        if not snapshot:
            return ""
        self._raw = snapshot
        stable = snapshot.rstrip(_FFFD)
        consumed = self._consumed
        if (consumed is self._upstream and len(stable) > len(consumed) and stable.startswith(consumed)
                and self._fast_lane):
            # The usual snapshot: the last one and more. What _advance does then, with one prefix comparison.
            delta = stable[len(consumed):]
            self._upstream = self._consumed = stable
            self._parts.append(delta)
            return delta
        return self._advance(stable)

    def flush(self, final: str | None = None) -> str:
        """End of stream: the held-back tail (or what `final` adds). Never raises; idempotent."""
        if isinstance(final, str):
            # A disagreeing `final` is reported as `mismatch`, not counted again as a rewrite.
            out = self._advance(final, count=False)
            self.mismatch = "".join(self._parts) != final
        else:
            out = self._advance(self._raw, count=False)
        self._raw = self._upstream
        return out

    def _advance(self, text: str, count: bool = True) -> str:
        if count and not text.startswith(self._upstream):
            self.rewrites += 1
        self._upstream = text
        consumed = self._consumed
        if not text.startswith(consumed):
            consumed = _align(consumed, text)
        if len(text) <= len(consumed):
            return ""
        delta = text[len(consumed):] if consumed else text
        self._consumed = text
        self._parts.append(delta)
        return delta


def _align(consumed: str, text: str) -> str:
    """Where the client's text (which corresponds to `consumed`) ends in a rewritten snapshot `text`: the prefix of
    `text` that the client already holds, in the sense that sending what follows it never repeats a character."""
    p = 0
    limit = min(len(consumed), len(text))
    while p < limit and consumed[p] == text[p]:
        p += 1
    diverged = consumed[p:]
    at = text.find(diverged, p) if diverged else -1
    if at >= 0:
        return text[:at + len(diverged)]
    return consumed  # not found: continue from the same length (only the corrected span differs)


# A stream's form is told by how its first choice's non-empty texts follow one another: EXTENDING texts that extend
# the one before say cumulative, NOT_EXTENDING that do not say deltas. One or the other comes within FORM_TEXTS texts.
EXTENDING: Final = 3
NOT_EXTENDING: Final = 2
FORM_TEXTS: Final = EXTENDING + NOT_EXTENDING  # the first text, then at most four that follow one before


class StreamForm:
    """Tells a cumulative stream (each text repeats the text so far, MindIE `fullTextEnabled`) from a delta stream by
    its first non-empty texts: three that extend the one before say cumulative, two that do not say deltas, whichever
    comes first (so within FORM_TEXTS texts). A delta stream extends by chance now and then (" the", " theater"),
    never three times out of four; a cumulative stream fails to extend only where its upstream revises text it already
    sent (docs/mindie.md "Rewrites in full-text mode"), which one text that does not extend allows. A snapshot that only
    revises a trailing U+FFFD still extends; a repeated one is skipped. `feed(text)` -> "cumulative", "deltas", or ""
    (not decided yet: a short answer may end first). `open` turns False once it has decided, so the caller stops
    feeding it (the per-chunk cost after the first few texts is one attribute read). `started`: it has read a text,
    so the stream's text is of a form not known until it decides. `doubted`: a text came that did not extend the one
    before, so that text is right under one form only (the caller holds it back until the verdict)."""

    __slots__ = ("_extended", "_last", "_other", "open", "started")

    def __init__(self) -> None:
        self._last = ""
        self._extended = 0
        self._other = 0
        self.open = True
        self.started = False

    @property
    def doubted(self) -> bool:
        return self._other > 0

    def feed(self, text: str) -> str:
        if not text:
            return ""
        self.started = True
        stable = text.rstrip(_FFFD)
        last = self._last
        if stable == last:  # a repeated snapshot (MindIE sends some) says nothing
            return ""
        self._last = stable
        if not last:
            return ""
        if len(stable) > len(last) and stable.startswith(last):
            self._extended += 1
            if self._extended == EXTENDING:
                self.open = False
                return "cumulative"
        else:
            self._other += 1
            if self._other == NOT_EXTENDING:
                self.open = False
                return "deltas"
        return ""
