"""Hub events -> a Responses API answer: one item machine (`ResponsesEncoder`) emits the client's events to a
consumer, the writer (`ResponsesWriter`: the event stream the SDKs and Codex parse, the same on HTTP and on a
WebSocket: only the transport's sink frames it) or the fold
(`ResponsesFold`: one `response` object) (docs/hub.md "Client side").

    reasoning deltas ─▶ a `reasoning` item   (reasoning_text deltas, or with `reasoning.summary` asked for one
                                              summary_text part; sealed `encrypted_content` when included)
    content deltas   ─▶ a `message` item     (one output_text part)
    tool-call deltas ─▶ `function_call` items, or `custom_tool_call` items for freeform tools
    finish, usage    ─▶ `response.completed` / `response.incomplete` with the whole response

The events are `response.created`, `response.in_progress`, then per item `output_item.added`, its deltas and
`…done` events and `output_item.done`, then the terminal event; every event has a `sequence_number`. Items come in
the order the upstream produced them (a reasoning item before the message it belongs to); an item is done when the
next kind starts or the answer ends. A failure after the head is `response.failed` whose data also carries a
top-level `error`, which makes the openai SDK raise `APIError` at once (Codex reads the response's `error`).
Only choice 0 is answered (the Responses API has no `n`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final

import orjson

from proxy.clients.base import Outcome
from proxy.clients.responses_request import ToolName, reasoning_of
from proxy.clients.signature import ThinkingSigner
from proxy.errors import ProxyError
from proxy.hub.canonical import RequestContext
from proxy.hub.events import Answer, Delta
from proxy.hub.sse import Event

_INCOMPLETE: Final = {"length": "max_output_tokens", "content_filter": "content_filter"}
# `reasoning.summary` values that ask for a summary. No upstream here summarises: the reasoning itself is sent as the
# one summary part, for clients that show only summaries (the Vercel AI SDK; Codex by default).
_SUMMARY: Final = frozenset({"auto", "concise", "detailed"})
# a response id's hex digits (12 random bytes: proxy/endpoint/inference.py), which its items' ids carry
_HEX: Final = 24
_dumps: Final = orjson.dumps  # (compiled: a static, not a module attribute looked up per call)
# The raw-reasoning stream events (a reasoning item's `reasoning_text` part), which the two Responses specifications
# name differently, by `client.responses_spec`: OpenAI's API reference and SDK types (as vLLM and Codex) say
# `response.reasoning_text.delta`/`.done`, Open Responses (its ResponseReasoningDeltaStreamingEvent) says
# `response.reasoning.delta`/`.done`, with the same fields. The summary events' names are the same in both.
# The pair is chosen once per client (proxy/clients/responses.py); the delta's name goes into each item's delta_name.
REASONING_EVENTS: Final[dict[str, tuple[bytes, str]]] = {
    "openai_api": (b"response.reasoning_text.delta", "response.reasoning_text.done"),
    "open_responses": (b"response.reasoning.delta", "response.reasoning.done"),
}
_OPENAI_REASONING: Final = REASONING_EVENTS["openai_api"]


class Echo:
    """The request fields a response object repeats, with OpenAI's defaults: read from the request once, written
    into the response object in its own literal (no dict merged into another; proxy/clients/responses.py)."""

    __slots__ = ("frequency_penalty", "instructions", "max_output_tokens", "max_tool_calls", "metadata",
                 "parallel_tool_calls", "presence_penalty", "previous_response_id", "prompt_cache_key", "reasoning",
                 "safety_identifier", "service_tier", "store", "temperature", "text", "tool_choice", "tools",
                 "top_logprobs", "top_p", "truncation", "user")

    def __init__(self, body: dict[str, Any]) -> None:
        reasoning = body.get("reasoning")
        text = body.get("text")
        self.instructions: Any = body.get("instructions")
        self.max_output_tokens: Any = body.get("max_output_tokens")
        self.metadata: Any = body.get("metadata") or {}
        self.parallel_tool_calls: Any = body.get("parallel_tool_calls", True)
        self.previous_response_id: Any = body.get("previous_response_id")
        self.reasoning: dict[str, Any] = ({"effort": reasoning.get("effort"), "summary": reasoning.get("summary")}
                                          if isinstance(reasoning, dict) else {"effort": None, "summary": None})
        self.store: Any = body.get("store", True)
        self.temperature: Any = body.get("temperature", 1.0)
        self.text: dict[str, Any] = ({**text, "format": text.get("format") or {"type": "text"}}
                                     if isinstance(text, dict) else {"format": {"type": "text"}})
        self.tool_choice: Any = body.get("tool_choice", "auto")
        self.tools: Any = [_echo_tool(tool) for tool in body.get("tools") or ()]
        # Required in the response object (Open Responses' ResponseResource): the request's value, else OpenAI's
        # default — the sampling defaults, no tool-call cap, no key, and "default" for the tier of an `auto` (or
        # absent) `service_tier`, the one tier there is here.
        self.presence_penalty: Any = _or(body.get("presence_penalty"), 0.0)
        self.frequency_penalty: Any = _or(body.get("frequency_penalty"), 0.0)
        self.top_logprobs: Any = _or(body.get("top_logprobs"), 0)
        self.max_tool_calls: Any = body.get("max_tool_calls")
        tier = body.get("service_tier")
        self.service_tier: Any = tier if isinstance(tier, str) and tier != "auto" else "default"
        self.safety_identifier: Any = body.get("safety_identifier")
        self.prompt_cache_key: Any = body.get("prompt_cache_key")
        self.top_p: Any = body.get("top_p", 1.0)
        self.truncation: Any = body.get("truncation", "disabled")
        self.user: Any = body.get("user")


class _Item:
    __slots__ = ("call_id", "custom", "delta_head", "delta_name", "id", "index", "name", "namespace", "parts")

    def __init__(self, item_id: str, index: int) -> None:
        self.id = item_id
        self.index = index
        self.parts: list[str] = []
        self.delta_name = b""  # the name of its delta events
        self.delta_head = b""  # a delta event's payload up to its `delta` value (built once per item)
        self.call_id = ""
        self.name = ""
        self.namespace: str | None = None
        self.custom = False


class ResponsesSink:
    """The consumer of one answer's Responses events, in order: the items' opening, delta and closing events (their
    done items, which the encoder keeps for the response object and the store, come with them), then the terminal
    event with the whole response. `take` hands over what is ready to send; `end` returns the last events (the
    stream's tail, or the response object)."""

    def opening(self, response: dict[str, Any]) -> list[Event]:
        """response.created and response.in_progress, with the response as it stands before any output."""
        return []

    def reasoning_added(self, item: _Item, summary: bool) -> None:
        """A reasoning item opens (`summary`: its text goes out as one summary part, not as reasoning_text)."""

    def message_added(self, item: _Item) -> None:
        """A message item opens, with its one output_text part."""

    def call_added(self, item: _Item) -> None:
        """A function_call (or custom_tool_call) item opens."""

    def delta(self, item: _Item, text: str) -> None:
        """More text for an open item: reasoning, output text, or a function call's arguments."""

    def reasoning_done(self, item: _Item, done: dict[str, Any], text: str, summary: bool) -> None:
        """A reasoning item closes: `done` is the item as the response holds it."""

    def message_done(self, item: _Item, done: dict[str, Any], text: str) -> None:
        """A message item closes."""

    def call_done(self, item: _Item, done: dict[str, Any], payload: str) -> None:
        """A tool call item closes: `payload` is its arguments (a custom tool's input)."""

    def whole_item(self, done: dict[str, Any], index: int) -> None:
        """An item made whole, not from deltas (compaction): it opens and closes at once."""

    def end(self, status: str, response: dict[str, Any]) -> list[Event]:
        """The terminal event: response.completed or response.incomplete, with the whole response."""
        return []

    def failure(self, failed: dict[str, Any], err: ProxyError) -> Event:
        """response.failed, after the head (a stream's only)."""
        raise NotImplementedError

    def take(self) -> list[Event]:
        return []


class ResponsesWriter(ResponsesSink):
    """The events of the Responses API's stream, each with its `sequence_number`."""

    def __init__(self, reasoning_events: tuple[bytes, str] = _OPENAI_REASONING) -> None:
        self.reasoning_events = reasoning_events  # (delta, done) event names: REASONING_EVENTS
        self.out: list[Event] = []
        self.seq = 2  # 0 and 1 are the head's (sent when the endpoint commits the stream, after the first feed)

    def opening(self, response: dict[str, Any]) -> list[Event]:
        # Both events carry the same response object: serialised once (orjson's cost is per key, and this object
        # has many), each event's JSON is the bytes orjson would make of it.
        skeleton = _dumps(response)
        return [Event(name, b'{"type":"%s","response":%s,"sequence_number":%d}' % (name, skeleton, n))
                for n, name in enumerate((b"response.created", b"response.in_progress"))]

    def reasoning_added(self, item: _Item, summary: bool) -> None:
        if summary:
            self._added({"id": item.id, "type": "reasoning", "summary": []}, item.index)
            self._event(b"response.reasoning_summary_part.added", {
                "type": "response.reasoning_summary_part.added", "item_id": item.id, "output_index": item.index,
                "summary_index": 0, "part": {"type": "summary_text", "text": ""}})
            self._deltas(b"response.reasoning_summary_text.delta", item, summary_index=True)
        else:
            self._added({"id": item.id, "type": "reasoning", "summary": [], "content": []}, item.index)
            self._deltas(self.reasoning_events[0], item, content_index=True)

    def message_added(self, item: _Item) -> None:
        self._added({"id": item.id, "type": "message", "role": "assistant", "status": "in_progress",
                     "content": []}, item.index)
        self._event(b"response.content_part.added", {
            "type": "response.content_part.added", "item_id": item.id, "output_index": item.index,
            "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}})
        self._deltas(b"response.output_text.delta", item, content_index=True, logprobs=True)

    def call_added(self, item: _Item) -> None:
        self._added(call_item(item, "", "in_progress"), item.index)
        if not item.custom:
            self._deltas(b"response.function_call_arguments.delta", item)

    def delta(self, item: _Item, text: str) -> None:
        self.out.append(Event(item.delta_name, b'%s%s,"sequence_number":%d}' % (
            item.delta_head, _dumps(text), self.seq)))
        self.seq += 1

    def reasoning_done(self, item: _Item, done: dict[str, Any], text: str, summary: bool) -> None:
        ends: tuple[tuple[str, dict[str, Any]], ...]  # the item's closing events before output_item.done
        if summary:
            ends = (("response.reasoning_summary_text.done", {"summary_index": 0, "text": text}),
                    ("response.reasoning_summary_part.done", {"summary_index": 0, "part": done["summary"][0]}))
        else:
            ends = ((self.reasoning_events[1], {"content_index": 0, "text": text}),)
        for name, data in ends:
            self._event(name.encode(), {"type": name, "item_id": item.id, "output_index": item.index, **data})
        self._done(done, item.index)

    def message_done(self, item: _Item, done: dict[str, Any], text: str) -> None:
        common = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        self._event(b"response.output_text.done",
                    {"type": "response.output_text.done", **common, "text": text, "logprobs": []})
        self._event(b"response.content_part.done", {"type": "response.content_part.done", **common,
                                                    "part": done["content"][0]})
        self._done(done, item.index)

    def call_done(self, item: _Item, done: dict[str, Any], payload: str) -> None:
        common = {"item_id": item.id, "output_index": item.index}
        if item.custom:
            if payload:
                self._event(b"response.custom_tool_call_input.delta",
                            {"type": "response.custom_tool_call_input.delta", **common, "delta": payload})
            self._event(b"response.custom_tool_call_input.done",
                        {"type": "response.custom_tool_call_input.done", **common, "input": payload})
        else:
            self._event(b"response.function_call_arguments.done",
                        {"type": "response.function_call_arguments.done", **common, "name": item.name,
                         "arguments": payload})
        self._done(done, item.index)

    def whole_item(self, done: dict[str, Any], index: int) -> None:
        self._added(done, index)
        self._done(done, index)

    def end(self, status: str, response: dict[str, Any]) -> list[Event]:
        kind = "response." + status
        self._event(kind.encode(), {"type": kind, "response": response})
        return self.take()

    def failure(self, failed: dict[str, Any], err: ProxyError) -> Event:
        return self._made(b"response.failed", {"type": "response.failed", "response": failed,
                                               "error": err.envelope()["error"]})

    def take(self) -> list[Event]:
        out = self.out
        self.out = []
        return out

    # -- events ---------------------------------------------------------------------------------------------------
    def _deltas(self, name: bytes, item: _Item, content_index: bool = False, logprobs: bool = False,
                summary_index: bool = False) -> None:
        """The item's delta events: their name and their payload's fixed part."""
        item.delta_name = name
        item.delta_head = _delta_head(name, item, content_index, logprobs, summary_index)

    def _made(self, name: bytes, data: dict[str, Any]) -> Event:
        data["sequence_number"] = self.seq
        self.seq += 1
        return Event(name, _dumps(data))

    def _event(self, name: bytes, data: dict[str, Any]) -> None:
        self.out.append(self._made(name, data))

    def _added(self, item: dict[str, Any], index: int) -> None:
        self._event(b"response.output_item.added", {"type": "response.output_item.added", "output_index": index,
                                                    "item": item})

    def _done(self, item: dict[str, Any], index: int) -> None:
        self._event(b"response.output_item.done", {"type": "response.output_item.done", "output_index": index,
                                                   "item": item})


class ResponsesFold(ResponsesSink):
    """The events folded into one response object (a non-stream answer): the terminal event carries it whole."""

    def end(self, status: str, response: dict[str, Any]) -> list[Event]:
        return [Event(None, _dumps(response))]


def responses_consumer(stream: bool, reasoning_events: tuple[bytes, str] = _OPENAI_REASONING) -> ResponsesSink:
    """Where a request's events go: the writer for a stream, the fold for one response object."""
    return ResponsesWriter(reasoning_events) if stream else ResponsesFold()


def _delta_head(name: bytes, item: _Item, content_index: bool = False, logprobs: bool = False,
                summary_index: bool = False) -> bytes:
    # The per-token events are the hot path: their payload's fixed part is serialised once per item.
    head = b'{"type":"' + name + b'","item_id":"' + item.id.encode() + b'","output_index":' + str(item.index).encode()
    if content_index:
        head += b',"content_index":0'
    if summary_index:
        head += b',"summary_index":0'
    if logprobs:
        head += b',"logprobs":[]'
    return head + b',"delta":'


def call_item(item: _Item, payload: str, status: str) -> dict[str, Any]:
    """A tool call item (function_call, or custom_tool_call for a freeform tool)."""
    if item.custom:
        out: dict[str, Any] = {"id": item.id, "type": "custom_tool_call", "status": status,
                               "call_id": item.call_id, "name": item.name, "input": payload}
    else:
        out = {"id": item.id, "type": "function_call", "status": status, "call_id": item.call_id,
               "name": item.name, "arguments": payload}
    if item.namespace is not None:
        out["namespace"] = item.namespace
    return out


class ResponsesEncoder:
    keepalive: Event | None = None  # the transport's own (an SSE comment)

    def __init__(self, ctx: RequestContext, answer: Answer, sink: ResponsesSink, echo: Echo,
                 tools: dict[str, ToolName], signer: ThinkingSigner | None) -> None:
        self.ctx = ctx
        self.answer = answer
        self.sink = sink
        self.echo = echo  # request fields the response object repeats (instructions, tools, temperature ...)
        self.tools = tools
        self.signer = signer  # set when the client asked for reasoning.encrypted_content
        self.items: list[dict[str, Any]] = []  # finished output items, in output order
        self.finish_reason: str | None = None
        # The conversation before this answer (hub messages), when the answer is kept (store, or the connection's
        # own state on a WebSocket: proxy/clients/responses.py); None: nothing of it outlives the request.
        self.history: list[dict[str, Any]] | None = None
        self.store = False  # the client asked to store it (`store`, default true)
        self._hex = ctx.response_id.partition("_")[2] or ctx.response_id
        self._summary = echo.reasoning["summary"] in _SUMMARY  # reasoning as a summary, not reasoning_text
        self._count = 0
        self._reasoning: _Item | None = None
        self._message: _Item | None = None
        self._calls: dict[int, _Item] = {}

    # -- the Encoder protocol -----------------------------------------------------------------------------------
    def head(self) -> list[Event]:
        return self.sink.opening(self.response("in_progress", with_output=False))

    def feed(self, deltas: Sequence[Delta]) -> list[Event]:
        self._events(deltas)
        return self.sink.take()

    def _events(self, deltas: Sequence[Delta]) -> None:
        sink = self.sink
        for d in deltas:
            if d.index != 0:
                continue
            if d.reasoning:
                self._reason(d.reasoning)
            if d.content:
                item = self._message
                if item is None:
                    item = self._open_message()
                item.parts.append(d.content)
                sink.delta(item, d.content)
            if d.tool_calls:
                for fragment in d.tool_calls:
                    self._call(fragment)
            if d.finish_reason is not None:
                self.finish_reason = d.finish_reason

    def finish(self) -> list[Event]:
        self._close_all()
        status = "incomplete" if self.finish_reason in _INCOMPLETE else "completed"
        return self.sink.end(status, self.response(status))

    def error(self, err: ProxyError) -> Event:
        failed = self.response("failed")
        failed["error"] = {"code": err.code, "message": err.message}
        return self.sink.failure(failed, err)

    def outcome(self) -> Outcome | None:
        """The stored record: the response object and the conversation so far in hub form, this answer included."""
        if self.history is None:
            return None
        status = "incomplete" if self.finish_reason in _INCOMPLETE else "completed"
        record = {"response": self.response(status),
                  "messages": [*self.history, assistant_turn(self.items, self.tools)]}
        return Outcome(self.ctx.response_id, record, self.store)

    # -- the response object --------------------------------------------------------------------------------------
    def response(self, status: str, with_output: bool = True) -> dict[str, Any]:
        e = self.echo
        out: dict[str, Any] = {
            "id": self.ctx.response_id,
            "object": "response",
            "created_at": self.ctx.created,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": None,
            "model": self.ctx.response_model,
            "output": self.items if with_output else [],
            "usage": self._usage() if with_output else None,
            "instructions": e.instructions,
            "max_output_tokens": e.max_output_tokens,
            "metadata": e.metadata,
            "parallel_tool_calls": e.parallel_tool_calls,
            "previous_response_id": e.previous_response_id,
            "reasoning": e.reasoning,
            "store": e.store,
            "temperature": e.temperature,
            "text": e.text,
            "tool_choice": e.tool_choice,
            "tools": e.tools,
            "top_p": e.top_p,
            "truncation": e.truncation,
            "user": e.user,
            "completed_at": int(time.time()) if status == "completed" else None,
            "presence_penalty": e.presence_penalty,
            "frequency_penalty": e.frequency_penalty,
            "top_logprobs": e.top_logprobs,
            "max_tool_calls": e.max_tool_calls,
            "service_tier": e.service_tier,
            "safety_identifier": e.safety_identifier,
            "prompt_cache_key": e.prompt_cache_key,
        }
        if status == "incomplete":
            out["incomplete_details"] = {"reason": _INCOMPLETE.get(self.finish_reason or "", "max_output_tokens")}
        return out

    def add_item(self, prefix: str, fields: dict[str, Any]) -> dict[str, Any]:
        """A finished output item made whole, not from deltas (a compaction item: responses_compact.py): its id
        (`<prefix>_...`, carrying the response's), and, streaming, its `output_item.added` and `.done` events."""
        item = self._new(prefix)
        done = {"id": item.id, **fields}
        self.sink.whole_item(done, item.index)
        self.items.append(done)
        return done

    def usage(self) -> dict[str, Any] | None:
        return self._usage()

    def _reasoning_text(self) -> str:
        return "".join(part["text"] for item in self.items if item["type"] == "reasoning"
                       for part in item.get("content") or item["summary"])

    def output_text(self) -> str:
        return "".join(part["text"] for item in self.items if item["type"] == "message" for part in item["content"])

    def _usage(self) -> dict[str, Any] | None:
        usage = self.answer.usage
        if usage is None:
            return None
        prompt = usage.get("prompt_tokens") or 0
        completion = usage.get("completion_tokens") or 0
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
        if not isinstance(reasoning, int):
            # Unknown is not zero, but the schemas require an integer here: the reasoning's estimated tokens (0: none)
            reasoning = min(_estimated_tokens(self._reasoning_text()), completion)
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": usage.get("total_tokens") or prompt + completion,
        }

    # -- items ----------------------------------------------------------------------------------------------------
    def _new(self, prefix: str) -> _Item:
        # An item's id carries its response's (item_response_hex reads it back: item references).
        # Two digits at least. Not `format(n, "02d")` nor an f-string: compiled, str() of an int is a C conversion,
        # a format spec a generic call (proxy/endpoint/inference.py `_new_request_id`).
        n = self._count
        item = _Item(prefix + "_" + self._hex + ("0" + str(n) if n < 10 else str(n)), n)
        self._count += 1
        return item

    def _reason(self, text: str) -> None:
        item = self._reasoning
        if item is None:
            self._close_message()
            item = self._reasoning = self._new("rs")
            self.sink.reasoning_added(item, self._summary)
        item.parts.append(text)
        self.sink.delta(item, text)

    def _open_message(self) -> _Item:
        self._close_reasoning()
        item = self._message = self._new("msg")
        self.sink.message_added(item)
        return item

    def _call(self, fragment: dict[str, Any]) -> None:
        index = fragment.get("index", 0)
        fn = fragment.get("function") or {}
        item = self._calls.get(index)
        if item is None:
            self._close_reasoning()
            self._close_message()
            upstream = fn.get("name") or ""
            tool = self.tools.get(upstream) or ToolName(upstream)
            item = self._new("ctc" if tool.custom else "fc")
            item.call_id = fragment.get("id") or "call_" + item.id.partition("_")[2]
            item.name, item.namespace, item.custom = tool.name, tool.namespace, tool.custom
            self._calls[index] = item
            self.sink.call_added(item)
        arguments = fn.get("arguments")
        if arguments:
            item.parts.append(arguments)
            if not item.custom:  # a custom tool's input is known once its JSON is complete: no deltas
                self.sink.delta(item, arguments)

    # -- closing items ----------------------------------------------------------------------------------------------
    def _close_all(self) -> None:
        self._close_reasoning()
        self._close_message()
        if self._calls:  # (no sort, and no key function made, for an answer without tool calls)
            for index in sorted(self._calls, key=lambda i: self._calls[i].index):
                self._close_call(self._calls[index])
            self._calls.clear()

    def _item_status(self) -> str:
        return "incomplete" if self.finish_reason in _INCOMPLETE else "completed"

    def _close_reasoning(self) -> None:
        item = self._reasoning
        if item is None:
            return
        self._reasoning = None
        text = "".join(item.parts)
        done: dict[str, Any]
        if self._summary:
            done = {"id": item.id, "type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}
        else:
            done = {"id": item.id, "type": "reasoning", "summary": [],
                    "content": [{"type": "reasoning_text", "text": text}]}
        if self.signer is not None:
            done["encrypted_content"] = self.signer.sign_text(text, carry=True)
        self.sink.reasoning_done(item, done, text, self._summary)
        self.items.append(done)

    def _close_message(self) -> None:
        item = self._message
        if item is None:
            return
        self._message = None
        text = "".join(item.parts)
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        done = {"id": item.id, "type": "message", "role": "assistant", "status": self._item_status(),
                "content": [part]}
        self.sink.message_done(item, done, text)
        self.items.append(done)

    def _close_call(self, item: _Item) -> None:
        raw = "".join(item.parts)
        payload = _custom_input(raw) if item.custom else raw
        done = call_item(item, payload, self._item_status())
        self.sink.call_done(item, done, payload)
        self.items.append(done)


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def _echo_tool(tool: Any) -> Any:
    """A function tool as the response object repeats it: `description`, `parameters` and `strict` are required
    there (null when the request left them out; `strict` stays null rather than claim a strictness the proxy does
    not enforce). Other tools are repeated as sent."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        return tool
    return {**tool, "description": tool.get("description"), "parameters": tool.get("parameters"),
            "strict": tool.get("strict")}


def _custom_input(arguments: str) -> str:
    """A freeform tool's input from the upstream's arguments for the one-string-parameter function it was given:
    `{"input": "..."}`; an object with one other string value, or text that is not JSON, is taken as it is."""
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    if isinstance(value, dict):
        if isinstance(value.get("input"), str):
            return str(value["input"])
        strings = [v for v in value.values() if isinstance(v, str)]
        if len(strings) == 1:
            return strings[0]
    if isinstance(value, str):
        return value
    return arguments


def item_response_hex(item_id: str) -> str | None:
    """The hex part of the id of the response whose output item `item_id` is, None for an id not made here: items
    are `<kind>_<the response id's hex><the item's number, two digits at least>` (ResponsesEncoder._new), and response
    ids carry 12 random bytes in hex (proxy/endpoint/inference.py)."""
    kind, _, rest = item_id.partition("_")
    if not kind or len(rest) < _HEX + 2 or not rest[_HEX:].isdigit():
        return None
    return rest[:_HEX]


def _estimated_tokens(text: str) -> int:
    """About how many tokens `text` took, without the model's tokenizer, by the rule of `POST
    /v1/messages/count_tokens` (proxy/clients/messages.py): one per 4 ASCII characters (rounded up), one per other
    character (CJK text runs at about one token per character)."""
    ascii_chars = len(text) if text.isascii() else sum(1 for ch in text if ch < "\x80")
    return -(-ascii_chars // 4) + len(text) - ascii_chars


def assistant_turn(items: list[dict[str, Any]], tools: dict[str, ToolName]) -> dict[str, Any]:
    """This answer's output items as the hub's assistant message (what the next turn's history holds)."""
    upstream = {(t.namespace, t.name): name for name, t in tools.items()}
    message: dict[str, Any] = {"role": "assistant", "content": None}
    text = "".join(p["text"] for item in items if item["type"] == "message" for p in item["content"])
    reasoning = "".join(reasoning_of(item) for item in items if item["type"] == "reasoning")
    calls = []
    for item in items:
        if item["type"] == "function_call":
            arguments = item["arguments"]
        elif item["type"] == "custom_tool_call":
            arguments = orjson.dumps({"input": item["input"]}).decode()
        else:
            continue
        name = upstream.get((item.get("namespace"), item["name"]), item["name"])
        calls.append({"id": item["call_id"], "type": "function", "function": {"name": name, "arguments": arguments}})
    if text:
        message["content"] = text
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return message
