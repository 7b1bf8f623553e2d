"""Streamed tool-call deltas -> the shape the openai SDK accumulates correctly.

The SDK (`openai.lib.streaming._deltas.accumulate_delta`) places each list entry at position `index` (so indices must
be 0, 1, 2… in the order calls first appear) and concatenates every repeated string field except `index` and `type`
(so a repeated `id` or `name` corrupts the call). Hence, per choice (docs/decisions.md "Streams"):

- A call's first delta carries `index`, `id`, `type: "function"` and `function: {name, arguments}`; a missing id
  becomes a generated `call_<24 hex>`, missing arguments become "".
- Later deltas of that call carry only `index` and `function.arguments` (a fragment); a repeated `id`, `type` or
  `name` is dropped, and a delta with nothing left to say is dropped.
- Which call a delta belongs to: a known `id` names its call; a new `id` starts a new call (also when the upstream
  reuses an `index` that already belongs to a call with another id, as some servers put every call at index 0);
  otherwise an `index` names the call last opened at that upstream index; a delta with neither `index` nor `id`
  continues the call before it. Upstream indices are only keys: the indices we send are our own, dense, in order.
- `arguments` that arrive as a JSON object/array are serialised to a JSON string.
- A call whose name has not arrived yet is held (its argument fragments collected) until a delta carries the name,
  because the first delta the client sees must carry it; `flush()` releases such calls with the name "" (nothing
  is held in a normal stream).

`normalize_message_tool_calls()` does the same for a non-stream `message.tool_calls`.
"""

from __future__ import annotations

import secrets
from typing import Any

import orjson

__all__ = ["ToolCallNormalizer", "new_call_id", "normalize_message_tool_calls"]


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def _arguments(value: Any) -> str | None:
    """A fragment of `function.arguments` as a string; None when there is none."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return str(value)


class _Call:
    __slots__ = ("held_args", "id", "index", "name", "upstream_id")

    def __init__(self, upstream_id: str | None) -> None:
        self.upstream_id = upstream_id
        self.id = upstream_id or new_call_id()
        self.name: str | None = None
        self.index: int | None = None  # our index, assigned when the first delta is sent
        self.held_args: list[str] = []


class ToolCallNormalizer:
    """One choice's tool calls. `feed(deltas) -> deltas`, `flush() -> deltas`; the input is never mutated."""

    __slots__ = ("_by_id", "_by_index", "_count", "_held", "_last")

    def __init__(self) -> None:
        self._by_index: dict[Any, _Call] = {}  # upstream index -> the call last opened there
        self._by_id: dict[str, _Call] = {}  # upstream id -> call
        self._last: _Call | None = None
        self._held: list[_Call] = []  # calls still waiting for their name, in order of appearance
        self._count = 0  # calls sent so far (the next index we hand out)

    @property
    def count(self) -> int:
        """How many calls have been sent to the client."""
        return self._count

    def feed(self, tool_calls: list[Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if not tool_calls:
            return out
        for delta in tool_calls:
            if not isinstance(delta, dict):
                continue
            fn = delta.get("function")
            if not isinstance(fn, dict):
                fn = {}
            call = self._call_for(delta)
            args = _arguments(fn.get("arguments"))
            if call.index is None:
                name = fn.get("name")
                if isinstance(name, str) and name:
                    call.name = name
                if args:
                    call.held_args.append(args)
                if call.name is None:
                    if call not in self._held:
                        self._held.append(call)
                    continue
                if self._held and call in self._held:
                    self._held.remove(call)
                out.append(self._first(call))
            elif args:
                out.append({"index": call.index, "function": {"arguments": args}})
        return out

    def flush(self) -> list[dict[str, Any]]:
        """Release calls whose name never arrived (name ""). Normally returns []."""
        out = []
        for call in self._held:
            call.name = ""
            out.append(self._first(call))
        self._held = []
        return out

    def _first(self, call: _Call) -> dict[str, Any]:
        call.index = self._count
        self._count += 1
        args = "".join(call.held_args)
        call.held_args = []
        return {"index": call.index, "id": call.id, "type": "function",
                "function": {"name": call.name, "arguments": args}}

    def _call_for(self, delta: dict[str, Any]) -> _Call:
        uid = delta.get("id") or None
        if not isinstance(uid, str):
            uid = None
        uidx = delta.get("index")
        if isinstance(uidx, bool) or not isinstance(uidx, (int, str)):
            uidx = None
        call: _Call | None
        if uid is not None:
            call = self._by_id.get(uid)
            if call is None:
                call = self._by_index.get(uidx) if uidx is not None else None
                if call is not None and call.upstream_id is None:
                    call.upstream_id = uid  # the id arrived late for a call already open: same call, id kept
                else:
                    call = _Call(uid)
                self._by_id[uid] = call
        elif uidx is not None:
            call = self._by_index.get(uidx)
            if call is None:
                call = _Call(None)
        else:
            call = self._last or _Call(None)
        if uidx is not None:
            self._by_index[uidx] = call
        self._last = call
        return call


def normalize_message_tool_calls(tool_calls: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Non-stream `message.tool_calls`: None for none (MindIE sends `[]`; the caller drops the key), otherwise
    copies with `id` (generated if missing), `type: "function"`, `function.name` and string `arguments` filled in."""
    if not tool_calls or not isinstance(tool_calls, list):
        return None
    out = []
    for call in tool_calls:
        if not isinstance(call, dict):
            continue
        fn = call.get("function")
        fn = dict(fn) if isinstance(fn, dict) else {}
        name = fn.get("name")
        fn["name"] = name if isinstance(name, str) else ""
        fn["arguments"] = _arguments(fn.get("arguments")) or ""
        new = dict(call)
        cid = new.get("id")
        new["id"] = cid if isinstance(cid, str) and cid else new_call_id()
        new["type"] = "function"
        new["function"] = fn
        out.append(new)
    return out or None
