"""Canonical upstream chunks -> hub events (`proxy.hub.events.Delta`), per request.

The normaliser evens out what any upstream may vary, whatever its dialect, and applies no client format:

    content ─▶ ThinkSplitter (inline <think>, per reasoning_source) ─┐
    reasoning_content / reasoning (field) ───────────────────────────┼▶ Delta(reasoning, content, tool_calls, ...)
    tool_calls ─▶ ToolCallNormalizer ────────────────────────────────┘
    usage ─▶ normalize_usage ─▶ Answer.usage (+ upstream-only fields ─▶ Answer.usage_extras)

Dialect quirks are undone before this (proxy/dialects, the upstream session: cumulative text, error finish reasons);
client formats are applied after it (proxy/clients). A non-stream answer is one final chunk through the same code
(`feed(chunk, final=True)`).
"""

from __future__ import annotations

from typing import Any, Final

from proxy.errors import StreamTruncated
from proxy.hub.canonical import CHAT, ChatChunk
from proxy.hub.events import Answer, Delta
from proxy.stream.think import ThinkSplitter
from proxy.stream.tool_calls import ToolCallNormalizer
from proxy.stream.usage import normalize_usage

# What the hub understands; anything else is passed on in Delta.extra / choice_extra / Answer.envelope_extra.
# (Asked as `d.keys() <= OWN`: a view compared with a set in C; `OWN.issuperset(d)` first copies d's keys into a new
# set.)
_DELTA_OWN: Final = frozenset({"role", "content", "reasoning_content", "reasoning", "tool_calls"})
_CHOICE_OWN: Final = frozenset({"index", "delta", "text", "finish_reason", "logprobs"})
_CHUNK_OWN: Final = frozenset({"id", "object", "created", "model", "choices", "usage"})
# A delta with only these keys may take the fast lane (MindIE repeats `role`).
_TEXT_ONLY: Final = frozenset({"role", "content"})


class _Choice:
    __slots__ = ("field_mode", "finished", "splitter", "started", "tools")

    def __init__(self, splitter: ThinkSplitter | None) -> None:
        self.splitter = splitter
        self.tools: ToolCallNormalizer | None = None
        self.started = False
        self.finished = False
        self.field_mode = False


class Normalizer:
    """One request's canonical chunks -> Delta events. `reasoning_source` and `starts_in_reasoning` come from the
    upstream session (proxy/dialects/base.py)."""

    def __init__(self, kind: str, reasoning_source: str, starts_in_reasoning: bool, answer: Answer,
                 fast_lane: bool = True) -> None:
        self.fast_lane = fast_lane  # False: every chunk takes the general path (tests compare the two)
        self.chat = kind == CHAT
        self.source = reasoning_source
        self.split = self.chat and reasoning_source in ("auto", "tags")
        self.starts_in_reasoning = starts_in_reasoning and self.split
        self.answer = answer
        self._choices: dict[int, _Choice] = {}
        self._lanes: set[int] = set()  # the choices whose plain text chunks may take the fast lane (feed)
        self._keys: set[str] = set()  # the fields of the last chunk, and those of them the hub does not know
        self._extra: tuple[str, ...] = ()
        self._whole = False  # a final chunk (a whole non-stream answer) was fed: it ended every choice
        # Counts the changes of answer.envelope_extra: a text lane template holds the envelope of its time
        # (proxy/hub/pipeline.py drops the templates when this moves on).
        self.envelope_version = 0

    def feed(self, chunk: ChatChunk, final: bool = False) -> list[Delta]:
        """The events of one canonical chunk. `final`: the whole answer (a non-stream body) — every choice ends here,
        with or without a finish_reason."""
        answer = self.answer
        if answer.upstream_id is None:
            upstream_id = chunk.get("id")
            if isinstance(upstream_id, str) and upstream_id:
                answer.upstream_id = upstream_id
                model = chunk.get("model")  # read once, with the id (not per chunk)
                if isinstance(model, str) and model:
                    answer.upstream_model = model
        usage = chunk.get("usage")
        if usage:
            normalized, extras = normalize_usage(usage)
            if extras:
                answer.usage_extras.update(extras)
            answer.usage = normalized
        # Fields the hub does not know (system_fingerprint, vendor extras), in the chunk's order. A stream's chunks
        # mostly have the same fields: they are sorted out again only when the fields change.
        keys = chunk.keys()
        if final:
            self._whole = True
            extra: tuple[str, ...] | list[str] = () if keys <= _CHUNK_OWN else [
                key for key in keys if key not in _CHUNK_OWN]
        elif keys != self._keys:
            self._keys = set(keys)
            extra = self._extra = () if keys <= _CHUNK_OWN else tuple(
                [key for key in keys if key not in _CHUNK_OWN])
        else:
            extra = self._extra
        if extra:
            envelope = answer.envelope_extra
            for key in extra:
                value = chunk[key]
                if key not in envelope or envelope[key] != value:
                    envelope[key] = value
                    self.envelope_version += 1
        choices = chunk.get("choices")
        if not choices:
            return []
        if len(choices) == 1 and not final:
            # The fast lane: the common chunk only adds text to a choice on the lane (started, not finished, no
            # think splitter), with nothing else to look at (no finish, logprobs, reasoning, tool calls, unknown
            # fields). Exactly the Delta the general path (_choice) makes of it (tests/test_normalize.py).
            choice = choices[0]
            index = choice.get("index") or 0
            if (index in self._lanes and choice.get("finish_reason") is None and choice.get("logprobs") is None
                    and choice.keys() <= _CHOICE_OWN):
                if self.chat:
                    delta = choice.get("delta")
                    if delta and delta.keys() <= _TEXT_ONLY:
                        text = delta.get("content")
                        if type(text) is str and text:
                            return [Delta(index, "", text)]
                else:
                    text = choice.get("text")
                    if type(text) is str and text:
                        return [Delta(index, "", text)]
        out = []
        for choice in choices:
            event = self._choice(choice, final)
            if event is not None:
                out.append(event)
        return out

    def finish(self, saw_done: bool) -> None:
        """End of the upstream answer: raise StreamTruncated unless every choice has finished (a whole answer has
        ended them all, even one with no choice)."""
        if self._whole:
            return
        if self._choices and all(st.finished for st in self._choices.values()):
            return
        if not saw_done:
            raise StreamTruncated(
                "The upstream closed the stream before the answer was complete.", reason="upstream_closed"
            )
        raise StreamTruncated(
            "The upstream ended the stream without a finish_reason; the answer may be incomplete.",
            reason="upstream_closed",
        )

    def passes_text(self, index: int) -> bool:
        """Text (content or reasoning field) of a plain event for choice `index` now comes out exactly as it came in:
        the choice is on the fast lane (started, not finished, no `<think>` splitting under way), which the text lane
        (proxy/stream/text_lane.py) also takes. `fast_lane=False` turns both off."""
        return index in self._lanes

    # -----------------------------------------------------------------------------------------------------------
    def _state(self, index: int) -> _Choice:
        st = self._choices.get(index)
        if st is None:
            st = self._choices[index] = _Choice(ThinkSplitter(self.starts_in_reasoning) if self.split else None)
        return st

    def _choice(self, choice: dict[str, Any], whole: bool) -> Delta | None:
        index = choice.get("index") or 0
        st = self._state(index)
        if st.finished:
            return None
        finish = choice.get("finish_reason")
        final = whole or finish is not None
        logprobs = choice.get("logprobs")
        extra = choice_extra = None
        tool_calls = None
        if self.chat:
            # Typed, so that compiled its reads are dict lookups, not methods called by name; a delta that is not
            # an object fails here (TypeError, compiled) or at its first read.
            delta: dict[str, Any] = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content")
            if reasoning is None:
                reasoning = delta.get("reasoning")
            r, c = self._text(st, delta.get("content"), reasoning, final)
            calls = delta.get("tool_calls")
            if calls or (final and st.tools is not None):
                if st.tools is None:
                    st.tools = ToolCallNormalizer()
                normalized = st.tools.feed(calls) if calls else []
                if final:
                    normalized += st.tools.flush()
                tool_calls = normalized or None
            if not delta.keys() <= _DELTA_OWN:  # refusal, audio, annotations, vendor extras
                extra = {k: v for k, v in delta.items() if k not in _DELTA_OWN}
        else:
            r, c = self._text(st, choice.get("text"), None, final)
        if not choice.keys() <= _CHOICE_OWN:
            choice_extra = {k: v for k, v in choice.items() if k not in _CHOICE_OWN}
        first = not st.started
        if not (
            r or c or tool_calls or extra or final or logprobs is not None or choice_extra or (first and self.chat)
        ):  # the chat client's role chunk: sent before any token
            if st.started and st.splitter is None and self.fast_lane:
                self._lanes.add(index)  # (the splitter may just have found plain text)
            return None
        # The fast lane (feed) takes the choice's plain text once it has started, has no splitter and is not over.
        st.started = True
        if final:
            st.finished = True
            self.answer.finish_reason = finish
            self._lanes.discard(index)
        elif st.splitter is None and self.fast_lane:
            self._lanes.add(index)
        return Delta(index, r, c, tool_calls, finish, logprobs, extra, choice_extra, first)

    def _text(self, st: _Choice, content: str | None, reasoning: str | None, final: bool) -> tuple[str, str]:
        """New (reasoning, content) text of one choice: inline tags -> reasoning (docs/decisions.md "Reasoning")."""
        held = ""
        held_reasoning = ""
        if reasoning is not None and self.source == "auto" and not st.field_mode:
            st.field_mode = True  # a reasoning field puts the response in field mode: content is not parsed
            if st.splitter is not None:
                for kind, s in st.splitter.flush():
                    if kind == "reasoning":
                        held_reasoning += s
                    else:
                        held += s
                st.splitter = None
        splitter = st.splitter
        if splitter is None:
            return held_reasoning + (reasoning or ""), held + (content or "")
        pieces = splitter.feed(content) if content else []
        if final:
            pieces = pieces + splitter.flush()
        elif splitter.passthrough:
            st.splitter = None  # the rest of this choice's content is plain text: no need to scan it
        r = reasoning or ""
        c = ""
        for kind, s in pieces:
            if kind == "reasoning":
                r += s
            else:
                c += s
        return r, c
