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
cannot take it back, so the policy is: **emitted text is final, and the client's text is kept as long as the
upstream's, never longer**. After a rewrite nothing is sent until the upstream text grows past the length the client
already has; then only the part beyond that length is sent. This never re-sends the common prefix (no duplication),
never grows the client's text past the upstream's, and for the usual same-length correction (a character re-decoded)
leaves exactly the corrected span differing. Any disagreement that remains is visible at `flush()` as `mismatch`.

`flush(final)` treats MindIE's `full_text` as the last, authoritative snapshot (nothing held back), returns whatever
the client is still missing, and sets `mismatch` when the client's text does not equal `final`.
"""

from __future__ import annotations

__all__ = ["CumulativeText"]

_FFFD = "\ufffd"


class CumulativeText:
    """One choice's cumulative text. `feed(snapshot) -> delta`, `flush(final=None) -> delta`."""

    __slots__ = ("_parts", "_raw", "_sent", "_upstream", "mismatch", "rewrites")

    def __init__(self) -> None:
        self._upstream = ""  # the last snapshot without its trailing U+FFFD run
        self._raw = ""  # the last non-empty snapshot as received
        self._sent = 0  # length of the text the client holds
        self._parts: list[str] = []  # what the client holds, in pieces (joined only at flush)
        self.rewrites = 0
        self.mismatch = False

    def feed(self, snapshot: str) -> str:
        if not snapshot:
            return ""
        self._raw = snapshot
        stable = snapshot.rstrip(_FFFD)
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
        sent = self._sent
        if len(text) <= sent:
            return ""
        delta = text[sent:] if sent else text
        self._sent = len(text)
        self._parts.append(delta)
        return delta
