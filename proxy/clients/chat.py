"""OpenAI Chat Completions (`/v1/chat/completions`) and legacy Completions (`/v1/completions`): the client spokes
closest to the hub. The request already is the canonical form; the encoder puts the hub's events back into chunks:

- the first chunk of each choice carries `role: "assistant"` (content "" when it carries nothing else);
- reasoning goes where `client.reasoning` says: `reasoning_content`, `reasoning`, re-inlined `<think>` tags, or
  nowhere (docs/decisions.md "Reasoning");
- usage follows `stream_options.include_usage` (the one place that knows it): `usage: null` on every chunk and a
  final `choices: []` chunk with the usage — zeros if the upstream reported none; no `usage` key without it;
  `client.usage_fields: <dialect>` adds that upstream dialect's own usage fields (its spoke's `client_usage_fields`);
- fields the hub does not know pass through (lossless for an OpenAI upstream);
- the encoder emits one chunk event per hub event to its consumer: `ChatWriter` makes each a plain event (a text
  chunk from cached bytes; the sink frames it as `data: ...`, and the stream ends with `[DONE]`: `stream_end`),
  `ChatFold` folds them into one `chat.completion` / `text_completion` (docs/hub.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import orjson

from proxy.clients.base import ClientCall, ClientDialect, Encoder, Headers, openai_error_response
from proxy.clients.validate import (
    ARRAY,
    BOOLEAN,
    INTEGER,
    NULL,
    NUMBER,
    OBJECT,
    STRING,
    TypeSpec,
    check_types,
    compile_table,
)
from proxy.dialects import dialect_usage_fields
from proxy.errors import ClientRequestError, ProxyError
from proxy.hub.canonical import CHAT, COMPLETIONS, RequestContext
from proxy.hub.events import Answer, Delta
from proxy.hub.sse import Event

if TYPE_CHECKING:
    from proxy.settings import Settings
    from proxy.state.base import StateStore

_dumps: Final = orjson.dumps  # (compiled: a static, not a module attribute looked up per chunk)
_ZERO_USAGE: Final = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}

# The JSON types of the fields the hub and the upstream spokes read (OpenAI's API reference; `null` where OpenAI
# accepts it). Checked once in decode: a wrong type is a 400 naming the parameter, never a 500 deeper down.
_SAMPLING_FIELDS: Final[dict[str, TypeSpec]] = {
    "model": STRING,
    "stream": (BOOLEAN, NULL),
    "stream_options": (OBJECT, NULL),
    "stream_options.include_usage": (BOOLEAN, NULL),
    "temperature": (NUMBER, NULL),
    "top_p": (NUMBER, NULL),
    "top_k": (INTEGER, NULL),
    "n": (INTEGER, NULL),
    "best_of": (INTEGER, NULL),
    "max_tokens": (INTEGER, NULL),
    "max_completion_tokens": (INTEGER, NULL),
    "stop": (STRING, ARRAY, NULL),
    "stop[]": STRING,
    "presence_penalty": (NUMBER, NULL),
    "frequency_penalty": (NUMBER, NULL),
    "repetition_penalty": (NUMBER, NULL),
    "logit_bias": (OBJECT, NULL),
    "top_logprobs": (INTEGER, NULL),
    "seed": (INTEGER, NULL),
    "user": (STRING, NULL),
    "response_format": (OBJECT, NULL),
    "response_format.type": STRING,
    "metadata": (OBJECT, NULL),
    "store": (BOOLEAN, NULL),
    "service_tier": (STRING, NULL),
    "chat_template_kwargs": (OBJECT, NULL),
    "chat_template_kwargs.enable_thinking": (BOOLEAN, NULL),
    "enable_thinking": (BOOLEAN, NULL),
    "reasoning_effort": (STRING, NULL),
    "thinking": (OBJECT, NULL),
    "thinking.type": STRING,
}
CHAT_FIELDS: Final[dict[str, TypeSpec]] = {
    **_SAMPLING_FIELDS,
    "logprobs": (BOOLEAN, NULL),
    "messages": ARRAY,
    "messages[]": OBJECT,
    "messages[].role": STRING,
    "messages[].content": (STRING, ARRAY, NULL),
    "messages[].content[]": OBJECT,
    "messages[].content[].type": STRING,
    "messages[].content[].text": STRING,
    "messages[].name": (STRING, NULL),
    "messages[].prefix": (BOOLEAN, NULL),
    "messages[].reasoning_content": (STRING, NULL),
    "messages[].reasoning": (STRING, NULL),
    "messages[].tool_call_id": (STRING, NULL),
    "messages[].tool_calls": (ARRAY, NULL),
    "messages[].tool_calls[]": OBJECT,
    "messages[].tool_calls[].id": STRING,
    "messages[].tool_calls[].type": STRING,
    "messages[].tool_calls[].function": OBJECT,
    "messages[].tool_calls[].function.name": STRING,
    "messages[].tool_calls[].function.arguments": STRING,
    "tools": (ARRAY, NULL),
    "tools[]": OBJECT,
    "tools[].type": STRING,
    "tools[].function": OBJECT,
    "tools[].function.name": STRING,
    "tools[].function.description": (STRING, NULL),
    "tools[].function.parameters": (OBJECT, NULL),
    "tool_choice": (STRING, OBJECT, NULL),
    "parallel_tool_calls": (BOOLEAN, NULL),
    "functions": (ARRAY, NULL),
    "function_call": (STRING, OBJECT, NULL),
    "modalities": (ARRAY, NULL),
}
COMPLETIONS_FIELDS: Final[dict[str, TypeSpec]] = {
    **_SAMPLING_FIELDS,
    "logprobs": (INTEGER, NULL),  # completions: how many logprobs per token
    "prompt": (STRING, ARRAY),
    "prompt[]": (STRING, INTEGER, ARRAY),
    "prompt[][]": INTEGER,
    "echo": (BOOLEAN, NULL),
    "suffix": (STRING, NULL),
}
_CHAT_TABLE: Final = compile_table(CHAT_FIELDS)
_COMPLETIONS_TABLE: Final = compile_table(COMPLETIONS_FIELDS)


class ChatCall(ClientCall):
    """A Chat Completions or Completions request: `include_usage` (stream_options.include_usage of a stream)."""

    include_usage: bool

    def __init__(self, request: dict[str, Any], kind: str, model: str, stream: bool, include_usage: bool) -> None:
        super().__init__(request, kind, model, stream)
        self.include_usage = include_usage


class ChatClient(ClientDialect[ChatCall]):
    name = "chat"
    path = "/v1/chat/completions"
    id_prefix = "chatcmpl-"
    stream_end = b"[DONE]"
    kind = CHAT
    fields = _CHAT_TABLE

    def __init__(self, settings: Settings, store: StateStore) -> None:
        super().__init__(settings, store)
        # `client.usage_fields`, looked up once: what the usage chat clients get goes through (None: as it is).
        self.usage_fields = dialect_usage_fields(settings.client.usage_fields)

    async def decode(self, body: dict[str, Any]) -> ChatCall:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise ClientRequestError("`model` is required and must be a non-empty string.", param="model")
        self._check(body)
        check_types(body, self.fields)
        stream = body.get("stream") is True
        opts = body.get("stream_options")
        include_usage = stream and isinstance(opts, dict) and opts.get("include_usage") is True
        return ChatCall(body, self.kind, model, stream, include_usage)

    def _check(self, body: dict[str, Any]) -> None:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ClientRequestError("`messages` must be a non-empty list.", param="messages")

    def encoder(self, call: ChatCall, ctx: RequestContext, answer: Answer) -> Encoder:
        client = self.settings.client
        return chat_encoder(ctx, answer, call.stream, call.include_usage, client.reasoning,
                            self.usage_fields, self.kind == CHAT)

    def error_response(self, err: ProxyError) -> tuple[int, Headers, bytes]:
        return openai_error_response(err)


class CompletionsClient(ChatClient):
    name = "completions"
    path = "/v1/completions"
    id_prefix = "cmpl-"
    kind = COMPLETIONS
    fields = _COMPLETIONS_TABLE

    def _check(self, body: dict[str, Any]) -> None:
        if "prompt" not in body:
            raise ClientRequestError("`prompt` is required.", param="prompt")


class ChatSink:
    """The consumer of one answer's chunk events (one per hub event, as the encoder formats them), and what both
    consumers read of the answer: its id and usage."""

    def __init__(self, ctx: RequestContext, answer: Answer, chat: bool,
                 usage_fields: Callable[[dict[str, Any]], dict[str, Any]] | None) -> None:
        self.ctx = ctx
        self.answer = answer
        self.chat = chat
        self.usage_fields = usage_fields
        self._id: str | None = None

    def begin(self) -> None:
        """Events of one read follow."""

    def text(self, index: int, text: str) -> None:
        """A chunk that only adds content (a Completions chunk: text) to choice `index`."""

    def reasoning(self, index: int, text: str) -> None:
        """A chunk that only adds reasoning to choice `index`, in the delta key the client asked for."""

    def choice(self, d: Delta, content: str, fields: dict[str, Any] | None) -> None:
        """Any other chunk: event `d` with its content as the client gets it and its reasoning `fields`."""

    def end(self) -> list[Event]:
        """The answer is complete: the last events (a stream's usage chunk, or the whole object)."""
        return []

    def take(self) -> list[Event]:
        return []

    def response_id(self) -> str:
        if self._id is None:
            upstream_id = self.answer.upstream_id
            self._id = upstream_id if upstream_id and self.ctx.upstream.keep_upstream_id else self.ctx.response_id
        return self._id

    def usage(self) -> dict[str, Any] | None:
        usage = self.answer.usage
        if usage is not None and self.usage_fields is not None:
            return self.usage_fields(usage)
        return usage


class ChatWriter(ChatSink):
    """The chunks as a stream's events, one plain event each."""

    def __init__(self, ctx: RequestContext, answer: Answer, chat: bool,
                 usage_fields: Callable[[dict[str, Any]], dict[str, Any]] | None, include_usage: bool,
                 reasoning_key: bytes | None) -> None:
        super().__init__(ctx, answer, chat, usage_fields)
        self.include_usage = include_usage
        self._object = "chat.completion.chunk" if chat else "text_completion"
        self.out: list[Event] = []
        # The hot path (a chunk that only adds text to one choice) is built from cached bytes: the envelope up to
        # the choice's index, and what follows the delta (`_tail`). Rebuilt when the envelope's extra fields change.
        self._head = b""
        self._tail = b""
        self._close = b""
        # Per choice index, everything up to the value of the delta's one field (or `text`), from `_head`.
        self._text_heads: dict[int, bytes] = {}
        self._reasoning_heads: dict[int, bytes] = {}
        self._extra_seen: dict[str, Any] | None = None
        self._reasoning_key = reasoning_key  # b'"reasoning_content":' or b'"reasoning":'

    def begin(self) -> None:
        if self._extra_seen != self.answer.envelope_extra:
            self._prefixes()

    # The common event adds text to a choice and nothing else: cached bytes around the one dumped string, byte for
    # byte what the general path (`choice`) produces (tests/clients/test_chat_encoder.py).
    def text(self, index: int, text: str) -> None:
        head = self._text_heads.get(index)
        if not self.chat:
            if head is None:
                head = self._cache(self._text_heads, index, b'"text":')
            self.out.append(Event(None, head + _dumps(text) + self._tail))
            return
        if head is None:
            head = self._cache(self._text_heads, index, b'"delta":{"content":')
        self.out.append(Event(None, head + _dumps(text) + self._close))

    def reasoning(self, index: int, text: str) -> None:
        head = self._reasoning_heads.get(index)
        if head is None:
            head = self._reasoning_head(index)
        self.out.append(Event(None, head + _dumps(text) + self._close))

    def choice(self, d: Delta, content: str, fields: dict[str, Any] | None) -> None:
        """The general path: one event -> one chunk."""
        made = self._chat_choice(d, content, fields) if self.chat else self._text_choice(d)
        self.out.append(Event(None, _dumps(self._envelope([made]))))

    def end(self) -> list[Event]:
        if self.include_usage:
            final = self._envelope([])
            final["usage"] = self.usage() or dict(_ZERO_USAGE)
            self.out.append(Event(None, _dumps(final)))
        return self.take()

    def take(self) -> list[Event]:
        out = self.out
        self.out = []
        return out

    def _reasoning_head(self, index: int) -> bytes:
        assert self._reasoning_key is not None  # (the encoder sends plain reasoning here only with a delta key)
        return self._cache(self._reasoning_heads, index, b'"delta":{' + self._reasoning_key)

    def _cache(self, heads: dict[int, bytes], index: int, key: bytes) -> bytes:
        """The bytes of a hot-path chunk of choice `index` up to the value of `key` (kept until the envelope
        changes)."""
        head = heads[index] = b"%s%d,%s" % (self._head, index, key)
        return head

    def _prefixes(self) -> None:
        extra = self.answer.envelope_extra
        self._extra_seen = dict(extra)
        envelope = _dumps({"id": self.response_id(), "object": self._object, "created": self.ctx.created,
                                 "model": self.ctx.response_model})
        self._head = envelope[:-1] + b',"choices":[{"index":'
        rest: dict[str, Any] = dict(extra)
        if self.include_usage:
            rest["usage"] = None
        after = b"," + _dumps(rest)[1:] if rest else b"}"
        self._tail = b',"logprobs":null,"finish_reason":null}]' + after
        self._close = b"}" + self._tail  # after the one value of a delta object
        self._text_heads.clear()
        self._reasoning_heads.clear()

    def _chat_choice(self, d: Delta, content: str, fields: dict[str, Any] | None) -> dict[str, Any]:
        out_delta: dict[str, Any] = {"role": "assistant"} if d.first else {}
        if fields:
            out_delta.update(fields)
        if content:
            out_delta["content"] = content
        elif d.first and len(out_delta) == 1:
            out_delta["content"] = ""
        if d.tool_calls:
            out_delta["tool_calls"] = d.tool_calls
        if d.extra:
            out_delta.update(d.extra)
        out: dict[str, Any] = {"index": d.index, "delta": out_delta}
        if d.choice_extra:
            out.update(d.choice_extra)
        out["logprobs"] = d.logprobs
        out["finish_reason"] = d.finish_reason
        return out

    def _text_choice(self, d: Delta) -> dict[str, Any]:
        out: dict[str, Any] = {"index": d.index, "text": d.content}
        if d.choice_extra:
            out.update(d.choice_extra)
        out["logprobs"] = d.logprobs
        out["finish_reason"] = d.finish_reason
        return out

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.response_id(),
            "object": self._object,
            "created": self.ctx.created,
            "model": self.ctx.response_model,
            "choices": choices,
        }
        if self.answer.envelope_extra:
            out.update(self.answer.envelope_extra)
        if self.include_usage:
            out["usage"] = None
        return out


class _Fold:
    """One choice of a non-stream answer, accumulated."""

    __slots__ = ("choice_extra", "content", "extra", "finish_reason", "logprobs", "reasoning", "tool_calls")

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.logprobs: Any = None
        self.extra: dict[str, Any] = {}
        self.choice_extra: dict[str, Any] = {}


class ChatFold(ChatSink):
    """The chunks folded into one `chat.completion` / `text_completion`."""

    def __init__(self, ctx: RequestContext, answer: Answer, chat: bool,
                 usage_fields: Callable[[dict[str, Any]], dict[str, Any]] | None, reasoning: str) -> None:
        super().__init__(ctx, answer, chat, usage_fields)
        self.reasoning_key = "reasoning" if reasoning == "reasoning" else "reasoning_content"
        self._folds: dict[int, _Fold] = {}

    def _choice(self, index: int) -> _Fold:
        f = self._folds.get(index)
        if f is None:
            f = self._folds[index] = _Fold()
        return f

    def text(self, index: int, text: str) -> None:
        f = self._choice(index)
        if text:
            f.content.append(text)

    def reasoning(self, index: int, text: str) -> None:
        self._choice(index).reasoning.append(text)

    def choice(self, d: Delta, content: str, fields: dict[str, Any] | None) -> None:
        f = self._choice(d.index)
        if fields:
            reasoning = fields.get("reasoning_content") or fields.get("reasoning")
            if reasoning:
                f.reasoning.append(reasoning)
        if content:
            f.content.append(content)
        for call in d.tool_calls or ():
            slot = f.tool_calls.get(call["index"])
            fn = call.get("function") or {}
            if slot is None:
                f.tool_calls[call["index"]] = {
                    "id": call.get("id"),
                    "type": call.get("type", "function"),
                    "function": {"name": fn.get("name") or "", "arguments": fn.get("arguments") or ""},
                }
            else:
                slot["function"]["arguments"] += fn.get("arguments") or ""
        if d.extra:
            f.extra.update(d.extra)
        if d.choice_extra:
            f.choice_extra.update(d.choice_extra)
        if d.logprobs is not None:
            f.logprobs = _merge_logprobs(f.logprobs, d.logprobs)
        if d.finish_reason is not None:
            f.finish_reason = d.finish_reason

    def end(self) -> list[Event]:
        choices = []
        for index in sorted(self._folds):
            f = self._folds[index]
            text = "".join(f.content)
            if self.chat:
                calls = [f.tool_calls[i] for i in sorted(f.tool_calls)]
                message: dict[str, Any] = {"role": "assistant"}
                message["content"] = text if text else (None if calls or f.extra.get("refusal") else "")
                if f.reasoning:
                    message[self.reasoning_key] = "".join(f.reasoning)
                if calls:
                    message["tool_calls"] = calls
                for key, value in f.extra.items():
                    message.setdefault(key, value)
                # Required (nullable) in OpenAI's schema, and always sent by OpenAI: null / [] where the upstream
                # gave none.
                message.setdefault("refusal", None)
                message.setdefault("annotations", [])
                choice: dict[str, Any] = {"index": index, "message": message}
            else:
                choice = {"index": index, "text": text}
            choice.update(f.choice_extra)
            choice["logprobs"] = f.logprobs
            choice["finish_reason"] = f.finish_reason
            choices.append(choice)
        result: dict[str, Any] = {
            "id": self.response_id(),
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.ctx.created,
            "model": self.ctx.response_model,
            "choices": choices,
        }
        result.update(self.answer.envelope_extra)
        usage = self.usage()
        if usage is not None:
            result["usage"] = usage
        return [Event(None, _dumps(result))]


_REASONING_KEYS: Final = {"reasoning_content": b'"reasoning_content":', "reasoning": b'"reasoning":'}


def chat_encoder(ctx: RequestContext, answer: Answer, stream: bool, include_usage: bool, reasoning: str,
                 usage_fields: Callable[[dict[str, Any]], dict[str, Any]] | None, chat: bool) -> ChatEncoder:
    """The encoder of one request and its consumer: the writer for a stream, the fold for one object."""
    sink: ChatSink
    if stream:
        sink = ChatWriter(ctx, answer, chat, usage_fields, include_usage, _REASONING_KEYS.get(reasoning))
    else:
        sink = ChatFold(ctx, answer, chat, usage_fields, reasoning)
    return ChatEncoder(sink, reasoning, chat)


class ChatEncoder:
    """Hub events -> chunk events for its consumer (`ChatSink`): reasoning where the client wants it, `<think>` tags
    re-inlined (their open/closed state per choice), and which events are plain text (the hot path)."""

    keepalive: Event | None = None  # the transport's own (an SSE comment)

    def __init__(self, sink: ChatSink, reasoning: str, chat: bool) -> None:
        self.sink = sink
        self.reasoning = reasoning
        self.chat = chat
        self._think_open: set[int] = set()  # think_tags: choices whose "<think>" was sent, "</think>" not yet
        # Plain reasoning takes the hot path only into a delta key of its own.
        self._reasoning_key = reasoning in _REASONING_KEYS

    # -- the Encoder protocol -----------------------------------------------------------------------------------
    def head(self) -> list[Event]:
        return []

    def feed(self, deltas: Sequence[Delta]) -> list[Event]:
        # One chunk per event: choices of one upstream chunk go out one by one, as OpenAI sends n > 1 streams.
        sink = self.sink
        sink.begin()
        self._events(deltas)
        return sink.take()

    def _events(self, deltas: Sequence[Delta]) -> None:
        sink = self.sink
        for d in deltas:
            if not (d.first or d.tool_calls or d.finish_reason is not None or d.logprobs is not None or d.extra
                    or d.choice_extra):
                if not self.chat:
                    sink.text(d.index, d.content)
                    continue
                if not d.reasoning:
                    # (`think_open` is empty unless the client wants think tags: no lookup per chunk then)
                    if d.content and not (self._think_open and d.index in self._think_open):
                        sink.text(d.index, d.content)
                        continue
                elif not d.content and self._reasoning_key:
                    sink.reasoning(d.index, d.reasoning)
                    continue
            self._general(d)

    def _general(self, d: Delta) -> None:
        """Any event, as a chunk of its own (the hot path's events too: tests/clients/test_chat_encoder.py)."""
        if self.chat:
            fields: dict[str, Any] = {}
            self.sink.choice(d, self._format(d, fields), fields)
        else:
            self.sink.choice(d, d.content, None)

    def finish(self) -> list[Event]:
        return self.sink.end()

    def error(self, err: ProxyError) -> Event:
        return Event(None, err.body())

    def outcome(self) -> None:
        return None  # nothing of a chat answer outlives the request

    def _format(self, d: Delta, out: dict[str, Any]) -> str:
        """Put reasoning where the client wants it; returns the (maybe re-inlined) content."""
        mode = self.reasoning
        if mode == "think_tags":
            prefix = ""
            is_open = d.index in self._think_open
            if d.reasoning:
                prefix = d.reasoning if is_open else "<think>" + d.reasoning
                self._think_open.add(d.index)
                is_open = True
            if is_open and (d.content or d.finish_reason is not None):
                prefix += "</think>\n\n"
                self._think_open.discard(d.index)
            return prefix + d.content
        if d.reasoning:
            if mode == "reasoning_content":
                out["reasoning_content"] = d.reasoning
            elif mode == "reasoning":
                out["reasoning"] = d.reasoning
        return d.content


def _merge_logprobs(a: Any, b: Any) -> Any:
    """Chat logprobs objects of several events -> one (their `content` lists joined)."""
    if a is None:
        return b
    if isinstance(a, dict) and isinstance(b, dict):
        merged = dict(a)
        for key, value in b.items():
            if isinstance(value, list) and isinstance(merged.get(key), list):
                merged[key] = merged[key] + value
            elif value is not None:
                merged[key] = value
        return merged
    return b
