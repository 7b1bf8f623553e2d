"""Reasoning continuity: the reasoning of an assistant turn that made tool calls, given back to an upstream that
needs it when the client's history lost it.

DeepSeek's thinking mode refuses a request whose history has an assistant tool-call turn without its
`reasoning_content` ("The `reasoning_content` in the thinking mode must be passed back to the API."), and most
OpenAI-style clients (LangChain, the Agents SDK, ...) drop that field when they build history. R1-era models are
the opposite: reasoning must never go back to them. So, per request, the upstream dialect says what the hub does
with reasoning on assistant turns (`Dialect.reasoning_replay`, from the upstream's `reasoning_replay` setting):

- `strip`: it is removed from every assistant turn (R1-era models);
- `keep`: the request goes as the client sent it;
- `restore`: a tool-call turn without reasoning gets it back — the original text, exactly, from the state store —
  and the reasoning of every tool-call turn of this answer is stored for the next request.

    canonical request ─▶ prepare() ─▶ session.build_request ─▶ upstream ─▶ Delta events ─▶ Recorder ─▶ save()
                         (strip / restore)                                              (before the last bytes)

Keys (namespace `reasoning`): `call:<tool-call id>` for each call of the turn — every client dialect decodes into
chat messages that carry the upstream's own tool-call ids — and, when the turn has text, `turn:<sha256 of the
content and the calls' names and arguments>` as a fallback for a client that renamed the ids. A turn found under
neither (history from elsewhere, an expired store) gets the dialect's `rules.reasoning_fallback` (DeepSeek: a fixed,
non-empty placeholder, since reports differ on whether DeepSeek accepts an empty one), never a 400 and never text the
client made up (docs/decisions.md "Client dialects and state"). An empty reasoning counts as none: a client's `""`
is restored like a missing field, and a recorded empty one gives way to the fallback where the dialect has one.

A store that cannot be reached: a request that needs a restore fails with 503 (`StoreUnavailable`); a failed
write after an answer is logged and counted (`dialect_proxy_reasoning_continuity_total{event="record_failed"}`),
and the answer still reaches the client — only a later turn may then get the fallback.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import orjson

from proxy.hub.canonical import CHAT

if TYPE_CHECKING:
    from proxy.dialects.base import Dialect
    from proxy.hub.canonical import ChatRequest, RequestContext
    from proxy.hub.events import Delta
    from proxy.metrics.definitions import Metrics
    from proxy.state.base import StateStore

log: Final = logging.getLogger("dialect_proxy")

NAMESPACE: Final = "reasoning"
REASONING_KEYS: Final = ("reasoning_content", "reasoning")
MAX_CALLS_PER_TURN: Final = 128  # keys written per turn (DeepSeek accepts at most 128 tools anyway)


def call_key(call_id: str) -> str:
    return "call:" + call_id


def turn_key(content: str, calls: list[tuple[str, str]]) -> str | None:
    """The fallback key of a turn: its text and its calls' (name, arguments), without ids. None for a turn without
    text: a bare call (same tool, same arguments) is too common to tell two conversations apart."""
    if not content:
        return None
    digest = hashlib.sha256(orjson.dumps([content, calls])).hexdigest()
    return "turn:" + digest


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # text parts
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _calls(message: dict[str, Any]) -> tuple[list[str], list[tuple[str, str]]]:
    ids: list[str] = []
    signature: list[tuple[str, str]] = []
    for call in message.get("tool_calls") or ():
        if not isinstance(call, dict):
            continue
        if isinstance(call.get("id"), str) and call["id"]:
            ids.append(call["id"])
        fn = call.get("function")
        if isinstance(fn, dict):
            signature.append((str(fn.get("name") or ""), str(fn.get("arguments") or "")))
    return ids, signature


def _has_reasoning(message: dict[str, Any]) -> bool:
    for key in REASONING_KEYS:
        value = message.get(key)
        if isinstance(value, str) and value:
            return True
    return False


# -- before the request ------------------------------------------------------------------------------------------


async def prepare(
    store: StateStore, dialect: Dialect, request: ChatRequest, ctx: RequestContext, metrics: Metrics
) -> Recorder | None:
    """Apply the replay mode to a canonical chat request (in place). Returns the recorder that must see this
    answer's events when the mode is `restore`, else None. Raises StoreUnavailable (503) when a turn needs a
    restore and the store cannot be reached."""
    if ctx.kind != CHAT or not isinstance(request.get("messages"), list):
        return None
    mode = dialect.reasoning_replay(request, ctx)
    if mode == "strip":
        strip(request)
        return None
    if mode != "restore":
        return None
    restored, fallback = await restore(store, request, dialect.rules.reasoning_fallback)
    if restored:
        metrics.reasoning_continuity(ctx.upstream.name, "restored", restored)
    if fallback:
        metrics.reasoning_continuity(ctx.upstream.name, "fallback", fallback)
    return Recorder(store, ctx.upstream.name, metrics)


def strip(request: ChatRequest) -> None:
    """Remove reasoning from every assistant turn."""
    messages = request["messages"]
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        if any(k in message for k in REASONING_KEYS):
            messages[i] = {k: v for k, v in message.items() if k not in REASONING_KEYS}


async def restore(store: StateStore, request: ChatRequest, fallback: str | None) -> tuple[int, int]:
    """Put the stored reasoning back into the assistant tool-call turns that lack it: (restored, fallback) counts.
    A turn that already carries reasoning (a non-empty `reasoning_content` or `reasoning`) is left alone."""
    messages = request["messages"]
    restored = fell_back = 0
    for i, message in enumerate(messages):
        if (
            not isinstance(message, dict)
            or message.get("role") != "assistant"
            or not message.get("tool_calls")
            or _has_reasoning(message)
        ):
            continue
        text = await lookup(store, message)
        if text is None or (not text and fallback):
            fell_back += 1
            if fallback is None:  # the upstream's own "no reasoning" form: the turn as the client sent it
                continue
            text = fallback
        else:
            restored += 1
        messages[i] = {**message, "reasoning_content": text}
    return restored, fell_back


async def lookup(store: StateStore, message: dict[str, Any]) -> str | None:
    ids, signature = _calls(message)
    for call_id in ids[:MAX_CALLS_PER_TURN]:
        value = await store.get(NAMESPACE, call_key(call_id))
        if value is not None:
            return value.decode("utf-8")
    key = turn_key(_text(message.get("content")), signature)
    if key is not None:
        value = await store.get(NAMESPACE, key)
        if value is not None:
            return value.decode("utf-8")
    return None


# -- after the answer --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Turn:
    reasoning: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)
    arguments: dict[int, list[str]] = field(default_factory=dict)

    def __init__(self) -> None:
        # Written out, as proxy/hub/events.py's Delta: a dataclass's generated `__init__` runs interpreted even
        # compiled.
        self.reasoning = []
        self.content = []
        self.ids = []
        self.names = {}
        self.arguments = {}


class Recorder:
    """Collects, per choice, the reasoning, the content and the tool calls of an answer from the same `Delta`
    events the client encoder gets; `save()` stores the reasoning of every choice that made tool calls."""

    __slots__ = ("_choices", "metrics", "store", "upstream")

    def __init__(self, store: StateStore, upstream: str, metrics: Metrics) -> None:
        self.store = store
        self.upstream = upstream
        self.metrics = metrics
        self._choices: dict[int, _Turn] = {}

    def feed(self, events: list[Delta]) -> None:
        for event in events:
            turn = self._choices.get(event.index)
            if turn is None:
                turn = self._choices[event.index] = _Turn()
            if event.reasoning:
                turn.reasoning.append(event.reasoning)
            if event.content:
                turn.content.append(event.content)
            for fragment in event.tool_calls or ():
                index = fragment.get("index", 0)
                call_id = fragment.get("id")
                if isinstance(call_id, str) and call_id:
                    turn.ids.append(call_id)
                fn = fragment.get("function")
                if isinstance(fn, dict):
                    if isinstance(fn.get("name"), str):
                        turn.names[index] = fn["name"]
                    if isinstance(fn.get("arguments"), str):
                        turn.arguments.setdefault(index, []).append(fn["arguments"])

    def entries(self) -> list[tuple[str, bytes]]:
        """(key, reasoning) pairs to store: every key of every choice that made tool calls."""
        out: list[tuple[str, bytes]] = []
        for turn in self._choices.values():
            if not turn.ids and not turn.names:
                continue
            value = "".join(turn.reasoning).encode("utf-8")
            out.extend((call_key(call_id), value) for call_id in turn.ids[:MAX_CALLS_PER_TURN])
            signature = [(turn.names.get(i, ""), "".join(turn.arguments.get(i, ()))) for i in sorted(turn.names)]
            key = turn_key("".join(turn.content), signature)
            if key is not None:
                out.append((key, value))
        return out

    async def save(self) -> None:
        """Store what `entries` lists. Never raises for a store failure: it is logged and counted, the answer goes
        on (only a later turn may then get the fallback)."""
        entries = self.entries()
        if not entries:
            return
        try:
            await asyncio.gather(*(self.store.put(NAMESPACE, key, value) for key, value in entries))
        except Exception as exc:  # StoreUnavailable, or any failure of a store implementation
            log.warning("reasoning continuity: storing %d key(s) failed: %s", len(entries), exc)
            self.metrics.reasoning_continuity(self.upstream, "record_failed")
            return
        self.metrics.reasoning_continuity(self.upstream, "recorded")
