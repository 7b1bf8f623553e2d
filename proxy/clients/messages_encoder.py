"""Hub events -> Anthropic Messages: SSE events (streaming) or one `Message` (non-streaming), from one state machine.

Content blocks open in the order the answer produces them and one at a time, as Anthropic streams them: reasoning
opens a `thinking` block, content a `text` block, each new tool call a `tool_use` block; a change of kind closes the
open block (a `thinking` block closes with its `signature_delta`, proxy/clients/signature.py). Streaming:

    message_start · (content_block_start · content_block_delta* · content_block_stop)* · message_delta · message_stop

Non-streaming, the same machine keeps the blocks and `finish()` returns the Message, so both give the same final
message (tests/clients/test_messages.py checks it through the anthropic SDK's own accumulator).

Per chunk: a text or thinking delta costs one orjson dump of the delta's string and one bytes join.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import orjson

from proxy.clients import tool_ids
from proxy.clients.messages_errors import error_body
from proxy.errors import ProxyError, UpstreamError
from proxy.hub.events import TextRun
from proxy.hub.jsontext import dumps_joined, dumps_text
from proxy.hub.sse import encode_event

if TYPE_CHECKING:
    import hmac

    from proxy.clients.base import ClientCall
    from proxy.clients.signature import ThinkingSigner
    from proxy.hub.canonical import RequestContext
    from proxy.hub.events import Answer, Delta

STOP_REASONS: Final = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                       "function_call": "tool_use", "content_filter": "refusal"}

PING: Final = encode_event(b"ping", b'{"type":"ping"}')
_STOP: Final = b"content_block_stop"
_START: Final = b"content_block_start"
_END: Final = b"}}\n\n"  # what follows a delta's value
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
    """A content_block_delta event (encode_event's framing) up to its value: cached per block for the hot path."""
    return b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,"delta":{"type":"%s","%s":' % (
        index, kind, field)


def _delta_event(index: int, kind: bytes, field: bytes, value: str) -> bytes:
    return _delta_head(index, kind, field) + dumps_text(value) + _END


class _Block:
    __slots__ = ("delta_head", "id", "index", "kind", "mac", "name", "parts", "signature")

    def __init__(self, kind: str, index: int) -> None:
        self.kind = kind  # "thinking" | "text" | "tool_use"
        self.index = index
        self.parts: list[str] = []  # text / thinking / argument fragments (kept when needed)
        self.mac: hmac.HMAC | None = None
        self.id = ""  # tool_use
        self.name = ""  # tool_use
        self.signature = ""  # thinking, once closed
        self.delta_head = b""  # text / thinking, streaming: a delta event's bytes up to its string (_delta_event's)


class MessagesEncoder:
    keepalive = PING

    def __init__(self, call: ClientCall, ctx: RequestContext, answer: Answer, signer: ThinkingSigner) -> None:
        self.stream = call.stream
        self.omit_thinking = bool(call.options.get("omit_thinking"))
        # Thinking blocks only when the request enabled thinking (DECISIONS.md): otherwise an upstream's reasoning is
        # left out of the answer (usage still counts it; continuity records it from the hub's events).
        self.show_thinking = bool(call.options.get("show_thinking"))
        self.stop_sequences = call.options.get("stop_sequences") or ()
        self.ctx = ctx
        self.answer = answer
        self.signer = signer
        self.blocks: list[_Block] = []
        self.open: _Block | None = None
        self.tools: dict[int, _Block] = {}  # upstream tool-call index -> its block
        self.finish_reason: str | None = None
        self.stop_sequence: str | None = None

    # ------------------------------------------------------------------ the block machine
    def _close(self, out: list[bytes]) -> None:
        block = self.open
        if block is None:
            return
        self.open = None
        if block.kind == "thinking":
            assert block.mac is not None
            block.signature = self.signer.sign(block.mac, "".join(block.parts) if self.omit_thinking else None)
            if self.stream:
                out.append(_delta_event(block.index, b"signature_delta", b"signature", block.signature))
        if self.stream:
            out.append(encode_event(_STOP, b'{"type":"content_block_stop","index":%d}' % block.index))

    def _start(self, kind: str, out: list[bytes]) -> _Block:
        self._close(out)
        block = _Block(kind, len(self.blocks))
        self.blocks.append(block)
        self.open = block
        if kind == "thinking":
            block.mac = self.signer.mac()
        if self.stream:
            block.delta_head = _delta_head(block.index, *_DELTA_KINDS[kind])
            if kind == "thinking":
                body = b'{"type":"thinking","thinking":"","signature":""}'
            else:
                body = _TEXT_START
            out.append(encode_event(_START, b'{"type":"content_block_start","index":%d,"content_block":%s}' % (
                block.index, body)))
        return block

    def _reasoning(self, text: str, out: list[bytes]) -> None:
        if not self.show_thinking:
            return
        block = self.open
        if block is None or block.kind != "thinking":
            block = self._start("thinking", out)
        assert block.mac is not None
        block.mac.update(text.encode())
        if self.omit_thinking or not self.stream:
            block.parts.append(text)
        else:
            out.append(block.delta_head + dumps_text(text) + _END)

    def _text(self, text: str, out: list[bytes]) -> None:
        block = self.open
        if block is None or block.kind != "text":
            block = self._start("text", out)
        if self.stream:
            out.append(block.delta_head + dumps_text(text) + _END)
        else:
            block.parts.append(text)

    def _tool(self, fragment: dict[str, Any], out: list[bytes]) -> None:
        position = fragment.get("index", 0)
        function = fragment.get("function") or {}
        block = self.tools.get(position)
        if block is None:
            upstream_id = fragment.get("id") or f"call_{self.ctx.response_id}_{position}"
            self._close(out)
            block = _Block("tool_use", len(self.blocks))
            block.id = tool_ids.to_client(upstream_id)
            block.name = function.get("name") or ""
            self.tools[position] = block
            self.blocks.append(block)
            self.open = block
            if self.stream:
                out.append(encode_event(_START, orjson.dumps({
                    "type": "content_block_start", "index": block.index,
                    "content_block": {"type": "tool_use", "id": block.id, "name": block.name, "input": {},
                                      "caller": _DIRECT}})))
        args = function.get("arguments")
        if args:
            if self.stream:
                out.append(_delta_event(block.index, b"input_json_delta", b"partial_json", args))
            else:
                block.parts.append(args)

    def _events(self, deltas: Sequence[Delta | TextRun]) -> list[bytes]:
        out: list[bytes] = []
        for delta in deltas:
            if type(delta) is TextRun:
                if delta.index:
                    continue
                block = self.open
                if delta.reasoning or block is None or block.kind != "text" or not self.stream:
                    out.extend(self._events(delta.deltas()))  # not the hot path below: as its Deltas
                    continue
                # The hot path below for each text, head + text + _END each, in one piece: the texts' JSON strings
                # joined by _END + head, between head and _END (proxy/hub/jsontext.py dumps_joined).
                head = block.delta_head
                out.append(dumps_joined(delta.texts, _END + head, head, _END))
                continue
            if delta.index:
                continue  # Anthropic has one answer per request (the proxy never asks for more)
            if delta.reasoning:
                self._reasoning(delta.reasoning, out)
            if delta.content:
                block = self.open
                if block is not None and block.kind == "text" and self.stream:  # the hot path, as _text does
                    out.append(block.delta_head + dumps_text(delta.content) + _END)
                else:
                    self._text(delta.content, out)
            if delta.tool_calls:
                for fragment in delta.tool_calls:
                    self._tool(fragment, out)
            if delta.finish_reason is not None:
                self.finish_reason = delta.finish_reason
                extra = delta.choice_extra
                matched = extra.get("stop_reason") if extra else None
                if isinstance(matched, str) and matched in self.stop_sequences:
                    self.stop_sequence = matched
        return out

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

    def message_usage(self, delta_usage: dict[str, Any]) -> dict[str, Any]:
        """A Message's usage (Usage): the message_delta's, and what only a whole Message carries — no cache written
        (zero by TTL), and no service tier or inference region that any upstream here reports."""
        return {**delta_usage, "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
                "service_tier": None, "inference_geo": None}

    def _message(self, content: list[dict[str, Any]], stop_reason: str | None,
                 usage: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.ctx.response_id, "type": "message", "role": "assistant", "model": self.ctx.response_model,
                "content": content, "stop_reason": stop_reason,
                "stop_sequence": self.stop_sequence if stop_reason == "stop_sequence" else None, **_STOP_NULLS,
                "usage": self.message_usage(usage)}

    # ------------------------------------------------------------------ the Encoder protocol
    def head(self) -> bytes:
        # The upstream's counts arrive with its last chunk: message_delta carries them all (the SDK takes them).
        start = self._message([], None, {"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0,
                                         "cache_read_input_tokens": 0, "output_tokens_details": None,
                                         "server_tool_use": None})
        return encode_event(b"message_start", orjson.dumps({"type": "message_start", "message": start}))

    def feed(self, deltas: Sequence[Delta | TextRun]) -> bytes:
        out = self._events(deltas)
        return b"".join(out) if out else b""

    def finish(self) -> bytes:
        out: list[bytes] = []
        self._close(out)
        stop_reason = self.stop_reason()
        if self.stream:
            out.append(encode_event(b"message_delta", orjson.dumps({
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason,
                          "stop_sequence": self.stop_sequence if stop_reason == "stop_sequence" else None,
                          **_STOP_NULLS},
                "usage": self.usage()})))
            out.append(encode_event(b"message_stop", b'{"type":"message_stop"}'))
            return b"".join(out)
        return orjson.dumps(self._message([self._content(b, stop_reason) for b in self.blocks], stop_reason,
                                          self.usage()))

    def _content(self, block: _Block, stop_reason: str) -> dict[str, Any]:
        if block.kind == "text":
            return {"type": "text", "text": "".join(block.parts), "citations": []}
        if block.kind == "thinking":
            return {"type": "thinking", "thinking": "" if self.omit_thinking else "".join(block.parts),
                    "signature": block.signature}
        args = "".join(block.parts)
        if not args.strip():
            value: Any = {}
        else:
            try:
                value = orjson.loads(args)
            except orjson.JSONDecodeError:
                value = None
            if not isinstance(value, dict):
                if stop_reason != "max_tokens":
                    raise UpstreamError(
                        f"The upstream's arguments for tool call {block.name!r} are not a JSON object: {args[:200]!r}")
                value = {}  # cut off by max_tokens: the call is incomplete, and stop_reason says so
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": value, "caller": _DIRECT}

    def error(self, err: ProxyError) -> bytes:
        return encode_event(b"error", orjson.dumps(error_body(err)))
