"""Scenario directives: how a request picks the mock's behaviour.

The text of the last user message (or the `prompt` of a completion request) may carry directives such as
`[mock:chunks=8]`, `[mock:think]` or `[mock:code=701,status=402]`. Several may appear, in one bracket separated by
commas or in several brackets. Keys are case-insensitive; unknown keys are ignored. See README.md for the table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_DIRECTIVE = re.compile(r"\[mock:([^\]]*)\]", re.IGNORECASE)


@dataclass(frozen=True)
class Scenario:
    """The directives of one request: key -> value ("" for a bare flag such as `[mock:think]`)."""

    flags: dict[str, str] = field(default_factory=dict)

    def has(self, key: str) -> bool:
        return key in self.flags

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.flags.get(key, default)

    def num(self, key: str, default: int | None = None, *, lo: int = 0, hi: int = 1 << 30) -> int | None:
        """The value as an int clamped to [lo, hi]; `default` when absent, empty or not a number."""
        raw = self.flags.get(key)
        if raw is None or raw == "":
            return default
        try:
            value = int(float(raw))
        except ValueError:
            return default
        return max(lo, min(hi, value))

    def seconds(self, key: str, default: float = 0.0, *, hi_ms: int = 120_000) -> float:
        """A `*_ms` directive as seconds (clamped to 120 s)."""
        ms = self.num(key, None, lo=0, hi=hi_ms)
        return default if ms is None else ms / 1000.0


EMPTY = Scenario()


def parse(text: str) -> Scenario:
    """All `[mock:...]` directives in `text`."""
    if "[mock:" not in text.lower():
        return EMPTY
    flags: dict[str, str] = {}
    for match in _DIRECTIVE.finditer(text):
        for part in match.group(1).split(","):
            key, _, value = part.strip().partition("=")
            key = key.strip().lower()
            if key:
                flags[key] = value.strip()
    return Scenario(flags)


def content_text(content: Any) -> str:
    """A message's text: the string itself, or the concatenated `text` parts of a list content."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content
                       if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def from_chat(body: Any) -> Scenario:
    """Directives of a chat request: the last message with role `user`."""
    if not isinstance(body, dict):
        return EMPTY
    messages = body.get("messages")
    if not isinstance(messages, list):
        return EMPTY
    sc = EMPTY
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            sc = parse(content_text(message.get("content")))
            break
    return _forced_tool_choice(body, sc)


def _forced_tool_choice(body: dict[str, Any], sc: Scenario) -> Scenario:
    """`tool_choice: "required"` (or a named function) with `tools`: a real server must call a tool, so the mock
    does, as `[mock:tool_calls]` would."""
    choice = body.get("tool_choice")
    forced = choice == "required" or (isinstance(choice, dict) and choice.get("type") == "function")
    if not forced or not body.get("tools") or sc.has("tool_calls") or sc.has("tool_calls_noindex"):
        return sc
    return Scenario({**sc.flags, "tool_calls": ""})


def from_prompt(body: Any) -> Scenario:
    """Directives of a completion request: its `prompt` (a string or a list whose strings are joined)."""
    if not isinstance(body, dict):
        return EMPTY
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = "".join(p for p in prompt if isinstance(p, str))
    return parse(prompt) if isinstance(prompt, str) else EMPTY
