"""Hub events -> Anthropic Messages: one state machine (`MessagesEncoder`) emits the client's events to a consumer,
the SSE writer for a stream or the fold for one `Message` (docs/hub.md "Client side").

Content blocks open in the order the answer produces them and one at a time, as Anthropic streams them: reasoning
opens a `thinking` block, content a `text` block, each new tool call a `tool_use` block; a change of kind closes the
open block (a `thinking` block closes with its signature, proxy/clients/signature.py). The events:

    message_start · (content_block_start · content_block_delta* · content_block_stop)* · message_delta · message_stop

`MessagesWriter` emits them as the stream's events (the transport's sink frames them); `MessagesFold` keeps the
blocks' text and makes the Message at the end, so both give the same final message (tests/clients/test_messages.py
checks it through the anthropic SDK's own accumulator).

Per chunk: a text or thinking delta costs one orjson dump of the delta's string and one bytes concatenation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import orjson

from proxy.clients import tool_ids
from proxy.clients.base import ClientCall, Headers
from proxy.clients.messages_errors import error_event
from proxy.errors import ProxyError, UpstreamError
from proxy.hub.canonical import CHAT
from proxy.hub.sse import Event

if TYPE_CHECKING:
    import hmac

    from proxy.clients.signature import ThinkingSigner
    from proxy.hub.canonical import RequestContext
    from proxy.hub.events import Answer, Delta

STOP_REASONS: Final = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                       "function_call": "tool_use", "content_filter": "refusal"}

_dumps: Final = orjson.dumps  # (compiled: a static, not a module attribute looked up per event)
PING: Final = Event(b"ping", b'{"type":"ping"}')
_STOP: Final = b"content_block_stop"
_START: Final = b"content_block_start"
_DELTA: Final = b"content_block_delta"
_END: Final = b"}}"  # what follows a delta's value
_DELTA_KINDS: Final = {"text": (b"text_delta", b"text"), "thinking": (b"thinking_delta", b"thinking")}
# The blocks' fixed parts as Anthropic's schema requires them (anthropic.json in llm-comply's specs: every key
# present): a tool_use block called by the model itself, and a text block's `citations` as an empty list — the schema
# allows a list or null, and strict clients accept only the list (the Vercel AI SDK's Anthropic provider declares
# it an optional array and refused a whole answer for a null).
_TEXT_START: Final = b'{"type":"text","text":"","citations":[]}'
_DIRECT: Final = {"type": "direct"}
# A Message's and a message_delta's own nullable fields: no container, no refusal details from any upstream here.
_STOP_NULLS: Final = {"stop_details": None, "container": None}


def _delta_head(index: int, kind: bytes, field: bytes) -> bytes:
    """A content_block_delta event's payload up to its value: cached per block for the hot path."""
    return b'{"type":"content_block_delta","index":%d,"delta":{"type":"%s","%s":' % (index, kind, field)


def _delta_event(index: int, kind: bytes, field: bytes, value: str) -> Event:
    return Event(_DELTA, _delta_head(index, kind, field) + _dumps(value) + _END)


class _Block:
    __slots__ = ("delta_head", "id", "index", "kind", "mac", "name", "parts", "signature")

    def __init__(self, kind: str, index: int) -> None:
        self.kind = kind  # "thinking" | "text" | "tool_use"
        self.index = index
        self.parts: list[str] = []  # thinking that is signed but not sent (omit_thinking)
        self.mac: hmac.HMAC | None = None
        self.id = ""  # tool_use
        self.name = ""  # tool_use
        self.signature = ""  # thinking, once closed
        self.delta_head = b""  # the writer's: a delta event's payload up to its string (_delta_event's)


class MessagesSink:
    """The consumer of one answer's Messages events, in the order above. `take` hands over what is ready to send;
    `end` is the last event and returns the last events (the stream's tail, or the whole Message)."""

    def opening(self, message: dict[str, Any]) -> list[Event]:
        """message_start, with the Message as it stands before any content."""
        return []

    def start(self, block: _Block) -> None:
        """content_block_start."""

    def delta(self, block: _Block, text: str) -> None:
        """content_block_delta: text, thinking, or a tool call's argument fragment, by the block's kind."""

    def stop(self, block: _Block) -> None:
        """content_block_stop (a thinking block carries its signature by now)."""

    def end(self, stop_reason: str, stop_sequence: str | None, usage: dict[str, Any]) -> list[Event]:
        """message_delta and message_stop: `usage` is a message_delta's (MessageDeltaUsage)."""
        return []

    def failure(self, err: ProxyError, request_id: str) -> Event:
        """The in-stream error after the head."""
        return error_event(err, request_id)

    def take(self) -> list[Event]:
        return []


class MessagesWriter(MessagesSink):
    """The events of Anthropic's stream."""

    def __init__(self) -> None:
        self.out: list[Event] = []

    def opening(self, message: dict[str, Any]) -> list[Event]:
        return [Event(b"message_start", _dumps({"type": "message_start", "message": message}))]

    def start(self, block: _Block) -> None:
        if block.kind == "tool_use":
            block.delta_head = _delta_head(block.index, b"input_json_delta", b"partial_json")
            self.out.append(Event(_START, _dumps({
                "type": "content_block_start", "index": block.index,
                "content_block": {"type": "tool_use", "id": block.id, "name": block.name, "input": {},
                                  "caller": _DIRECT}})))
            return
        block.delta_head = _delta_head(block.index, *_DELTA_KINDS[block.kind])
        body = b'{"type":"thinking","thinking":"","signature":""}' if block.kind == "thinking" else _TEXT_START
        self.out.append(Event(_START, b'{"type":"content_block_start","index":%d,"content_block":%s}' % (
            block.index, body)))

    def delta(self, block: _Block, text: str) -> None:
        self.out.append(Event(_DELTA, block.delta_head + _dumps(text) + _END))

    def stop(self, block: _Block) -> None:
        if block.kind == "thinking":
            self.out.append(_delta_event(block.index, b"signature_delta", b"signature", block.signature))
        self.out.append(Event(_STOP, b'{"type":"content_block_stop","index":%d}' % block.index))

    def end(self, stop_reason: str, stop_sequence: str | None, usage: dict[str, Any]) -> list[Event]:
        self.out.append(Event(b"message_delta", _dumps({
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence, **_STOP_NULLS},
            "usage": usage})))
        self.out.append(Event(b"message_stop", b'{"type":"message_stop"}'))
        return self.take()

    def take(self) -> list[Event]:
        out = self.out
        self.out = []
        return out


class MessagesFold(MessagesSink):
    """The events folded into one Message (a non-stream answer)."""

    def __init__(self, ctx: RequestContext) -> None:
        self.ctx = ctx
        self.blocks: list[_Block] = []
        self.parts: list[list[str]] = []  # per block, in block order: its text, thinking or argument fragments

    def start(self, block: _Block) -> None:
        self.blocks.append(block)
        self.parts.append([])

    def delta(self, block: _Block, text: str) -> None:
        self.parts[block.index].append(text)

    def end(self, stop_reason: str, stop_sequence: str | None, usage: dict[str, Any]) -> list[Event]:
        content = [_content(block, "".join(self.parts[block.index]), stop_reason) for block in self.blocks]
        return [Event(None, _dumps(message_object(self.ctx, content, stop_reason, stop_sequence, usage)))]


def _content(block: _Block, text: str, stop_reason: str) -> dict[str, Any]:
    if block.kind == "text":
        return {"type": "text", "text": text, "citations": []}
    if block.kind == "thinking":  # (empty when the thinking is omitted: signed, never sent)
        return {"type": "thinking", "thinking": text, "signature": block.signature}
    if not text.strip():
        value: Any = {}
    else:
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            value = None
        if not isinstance(value, dict):
            if stop_reason != "max_tokens":
                raise UpstreamError(
                    f"The upstream's arguments for tool call {block.name!r} are not a JSON object: {text[:200]!r}")
            value = {}  # cut off by max_tokens: the call is incomplete, and stop_reason says so
    return {"type": "tool_use", "id": block.id, "name": block.name, "input": value, "caller": _DIRECT}


def message_usage(delta_usage: dict[str, Any]) -> dict[str, Any]:
    """A Message's usage (Usage): the message_delta's, and what only a whole Message carries — no cache written
    (zero by TTL), and no service tier or inference region that any upstream here reports."""
    return {**delta_usage, "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
            "service_tier": None, "inference_geo": None}


def message_object(ctx: RequestContext, content: list[dict[str, Any]], stop_reason: str | None,
                   stop_sequence: str | None, usage: dict[str, Any]) -> dict[str, Any]:
    return {"id": ctx.response_id, "type": "message", "role": "assistant", "model": ctx.response_model,
            "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence, **_STOP_NULLS,
            "usage": message_usage(usage)}


class MessagesCall(ClientCall):
    """An Anthropic Messages request: what its encoder needs again."""

    omit_thinking: bool  # thinking blocks are left out of the answer (proxy/clients/messages.py decode_request)
    show_thinking: bool  # the request enabled thinking
    stop_sequences: Sequence[str]  # which stop sequence ended the answer is reported back

    def __init__(self, request: dict[str, Any], model: str, stream: bool, *, omit_thinking: bool = False,
                 show_thinking: bool = False, stop_sequences: Sequence[str] = (),
                 headers: Headers | None = None) -> None:
        super().__init__(request, CHAT, model, stream, headers)
        self.omit_thinking = omit_thinking
        self.show_thinking = show_thinking
        self.stop_sequences = stop_sequences


def messages_consumer(call: ClientCall, ctx: RequestContext) -> MessagesSink:
    """Where a request's events go: the writer for a stream, the fold for one Message."""
    return MessagesWriter() if call.stream else MessagesFold(ctx)


class MessagesEncoder:
    keepalive: Event | None = PING

    def __init__(self, call: MessagesCall, ctx: RequestContext, answer: Answer, signer: ThinkingSigner,
                 sink: MessagesSink) -> None:
        self.sink = sink
        self.omit_thinking = call.omit_thinking
        # Thinking blocks only when the request enabled thinking (docs/decisions.md "Client dialects and
        # state"): otherwise an upstream's reasoning is
        # left out of the answer (usage still counts it; continuity records it from the hub's events).
        self.show_thinking = call.show_thinking
        self.stop_sequences = call.stop_sequences
        self.ctx = ctx
        self.answer = answer
        self.signer = signer
        self.blocks: list[_Block] = []
        self.open: _Block | None = None
        self.tools: dict[int, _Block] = {}  # upstream tool-call index -> its block
        self.finish_reason: str | None = None
        self.stop_sequence: str | None = None

    # ------------------------------------------------------------------ the block machine
    def _close(self) -> None:
        block = self.open
        if block is None:
            return
        self.open = None
        if block.kind == "thinking":
            assert block.mac is not None
            block.signature = self.signer.sign(block.mac, "".join(block.parts) if self.omit_thinking else None)
        self.sink.stop(block)

    def _start(self, kind: str) -> _Block:
        self._close()
        block = _Block(kind, len(self.blocks))
        self.blocks.append(block)
        self.open = block
        if kind == "thinking":
            block.mac = self.signer.mac()
        self.sink.start(block)
        return block

    def _reasoning(self, text: str) -> None:
        if not self.show_thinking:
            return
        block = self.open
        if block is None or block.kind != "thinking":
            block = self._start("thinking")
        assert block.mac is not None
        block.mac.update(text.encode())
        if self.omit_thinking:  # signed, never sent
            block.parts.append(text)
        else:
            self.sink.delta(block, text)

    def _tool(self, fragment: dict[str, Any]) -> None:
        position = fragment.get("index", 0)
        function = fragment.get("function") or {}
        block = self.tools.get(position)
        if block is None:
            upstream_id = fragment.get("id") or f"call_{self.ctx.response_id}_{position}"
            self._close()
            block = _Block("tool_use", len(self.blocks))
            block.id = tool_ids.to_client(upstream_id)
            block.name = function.get("name") or ""
            self.tools[position] = block
            self.blocks.append(block)
            self.open = block
            self.sink.start(block)
        args = function.get("arguments")
        if args:
            self.sink.delta(block, args)

    def _events(self, deltas: Sequence[Delta]) -> None:
        sink = self.sink
        for delta in deltas:
            if delta.index:
                continue  # Anthropic has one answer per request (the proxy never asks for more)
            if delta.reasoning:
                self._reasoning(delta.reasoning)
            if delta.content:
                block = self.open
                if block is None or block.kind != "text":
                    block = self._start("text")
                sink.delta(block, delta.content)
            if delta.tool_calls:
                for fragment in delta.tool_calls:
                    self._tool(fragment)
            if delta.finish_reason is not None:
                self.finish_reason = delta.finish_reason
                extra = delta.choice_extra
                matched = extra.get("stop_reason") if extra else None
                if isinstance(matched, str) and matched in self.stop_sequences:
                    self.stop_sequence = matched

    # ------------------------------------------------------------------ summary
    def stop_reason(self) -> str:
        finish = self.finish_reason or self.answer.finish_reason
        if finish == "length":
            return "max_tokens"
        if self.tools:
            return "tool_use"
        if self.stop_sequence is not None:
            return "stop_sequence"
        return STOP_REASONS.get(finish or "stop", "end_turn")

    def usage(self) -> dict[str, Any]:
        """A message_delta's usage (MessageDeltaUsage): the upstream's counts."""
        usage = self.answer.usage or {}
        prompt = usage.get("prompt_tokens") or 0
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if not isinstance(cached, int):
            cached = usage.get("prompt_cache_hit_tokens") or 0
        cached = min(cached, prompt)
        completion = usage.get("completion_tokens_details")
        thinking = completion.get("reasoning_tokens") if isinstance(completion, dict) else None
        # Anthropic's input_tokens leave out the cached part; the proxy never writes a prompt cache of its own, and
        # no upstream here runs server tools. The thinking-token count only where the upstream gave one.
        return {"input_tokens": prompt - cached, "output_tokens": usage.get("completion_tokens") or 0,
                "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached,
                "output_tokens_details": {"thinking_tokens": thinking} if isinstance(thinking, int) else None,
                "server_tool_use": None}

    # ------------------------------------------------------------------ the Encoder protocol
    def head(self) -> list[Event]:
        # The upstream's counts arrive with its last chunk: message_delta carries them all (the SDK takes them).
        return self.sink.opening(message_object(self.ctx, [], None, None, {
            "input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
            "output_tokens_details": None, "server_tool_use": None}))

    def feed(self, deltas: Sequence[Delta]) -> list[Event]:
        self._events(deltas)
        return self.sink.take()

    def finish(self) -> list[Event]:
        self._close()
        stop_reason = self.stop_reason()
        return self.sink.end(stop_reason, self.stop_sequence if stop_reason == "stop_sequence" else None,
                             self.usage())

    def error(self, err: ProxyError) -> Event:
        return self.sink.failure(err, self.ctx.request_id)

    def outcome(self) -> None:
        return None  # nothing of a Message outlives the request
