"""Inline `<think>…</think>` in content -> ("reasoning", text) and ("content", text) pieces, streaming-safe.

The rules (docs/decisions.md "Reasoning"):
- `start_in_reasoning=True` (DeepSeek-R1-family templates put the opening tag in the prompt): everything before
  `</think>` is reasoning. An explicit `<think>` at the very start (after optional whitespace) is consumed, together
  with that whitespace; a `<think>` anywhere else is reasoning text.
- `start_in_reasoning=False`: only a `<think>` at the start of the content (leading whitespace allowed) opens the
  block; the whitespace before it is dropped with the tag. A `<think>` later on, and a `</think>` with no opening tag,
  are plain content.
- Whitespace right after `</think>` (typically "\\n\\n") is not content: leading whitespace of the content that
  follows is dropped, also when it arrives in later feeds. Text after the block is content, tags and all.
- A stream that ends inside the block delivers everything as reasoning (the content stays empty).

Latency: a tag may be split across feeds at any character, so a suffix that could still become `</think>` (or, at the
very start, whitespace plus a prefix of `<think>`) is held back until the next feed decides it; nothing else is held.
Once the content phase is reached, feeds pass straight through.
"""

from __future__ import annotations

from typing import Final

__all__ = ["CONTENT", "REASONING", "ThinkSplitter"]

REASONING: Final = "reasoning"
CONTENT: Final = "content"

_OPEN: Final = "<think>"
_CLOSE: Final = "</think>"
_CLOSE_LEN: Final = len(_CLOSE)

# States
_START: Final = 0  # nothing decided yet: leading whitespace and a possible opening tag are held
_IN: Final = 1  # inside the thinking block
_AFTER: Final = 2  # just after </think>: dropping leading whitespace of the content
_OUT: Final = 3  # content, passed through


class ThinkSplitter:
    """One choice's splitter. `feed(text) -> [(kind, text), ...]`, `flush() -> [...]`; kinds never carry ""."""

    __slots__ = ("_held", "_start_in_reasoning", "_state")

    def __init__(self, start_in_reasoning: bool = False) -> None:
        self._start_in_reasoning = start_in_reasoning
        self._state = _START
        self._held = ""

    @property
    def in_reasoning(self) -> bool:
        """True while the text seen so far is inside the thinking block (or may still open one)."""
        return self._state == _IN or (self._state == _START and self._start_in_reasoning)

    @property
    def passthrough(self) -> bool:
        """Decided for good: everything fed from now on is content, unchanged, and nothing is held (the caller may
        stop feeding and take the text as content)."""
        return self._state == _OUT

    def feed(self, text: str) -> list[tuple[str, str]]:
        state = self._state
        if state == _OUT:
            return [(CONTENT, text)] if text else []
        if not text:
            return []
        if self._held:
            text = self._held + text
            self._held = ""
        out: list[tuple[str, str]] = []

        if state == _START:
            stripped = text.lstrip()
            if stripped.startswith(_OPEN):
                text = stripped[len(_OPEN):]
                state = _IN
            elif _OPEN.startswith(stripped):  # only whitespace, or a prefix of "<think>": undecided
                self._held = text
                return out
            elif self._start_in_reasoning:
                state = _IN  # no explicit tag: the text (whitespace included) is reasoning as sent
            else:
                self._state = _OUT
                out.append((CONTENT, text))
                return out

        if state == _IN:
            i = text.find(_CLOSE)
            if i < 0:
                # Hold a suffix that could be the start of "</think>". It begins with the only "<" in the tag, so
                # the last "<" among the final len-1 characters is the one candidate.
                j = text.rfind("<", max(0, len(text) - _CLOSE_LEN + 1))
                if j >= 0 and _CLOSE.startswith(text[j:]):
                    self._held = text[j:]
                    text = text[:j]
                if text:
                    out.append((REASONING, text))
                self._state = _IN
                return out
            if i:
                out.append((REASONING, text[:i]))
            text = text[i + _CLOSE_LEN:]
            state = _AFTER

        # state == _AFTER
        text = text.lstrip()
        if text:
            state = _OUT
            out.append((CONTENT, text))
        self._state = state
        return out

    def flush(self) -> list[tuple[str, str]]:
        """End of stream: held text is delivered as what it turned out to be (never a tag, since none completed)."""
        held, self._held = self._held, ""
        if not held:
            return []
        if self._state == _IN or (self._state == _START and self._start_in_reasoning):
            return [(REASONING, held)]
        return [(CONTENT, held)]  # _START without reasoning: whitespace / a partial "<think>" is plain content
