"""OpenAI Chat Completions (`/v1/chat/completions`) and legacy Completions (`/v1/completions`): the client spokes
closest to the hub. The request already is the canonical form; the encoder puts the hub's events back into chunks:

- the first chunk of each choice carries `role: "assistant"` (content "" when it carries nothing else);
- reasoning goes where `client.reasoning` says: `reasoning_content`, `reasoning`, re-inlined `<think>` tags, or
  nowhere (DECISIONS.md "Reasoning");
- usage follows `stream_options.include_usage` (the one place that knows it): `usage: null` on every chunk and a
  final `choices: []` chunk with the usage — zeros if the upstream reported none; no `usage` key without it;
  `client.usage_fields: <dialect>` adds that upstream dialect's own usage fields (its spoke's `client_usage_fields`);
- fields the hub does not know pass through (lossless for an OpenAI upstream);
- non-streaming, the same events are folded into one `chat.completion` / `text_completion`.
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
from proxy.hub.events import Answer, Delta, TextRun
from proxy.hub.jsontext import dumps_joined, dumps_text
from proxy.hub.sse import DONE, KEEPALIVE, encode_data

if TYPE_CHECKING:
    from proxy.settings import Settings
    from proxy.state.base import StateStore

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


class ChatClient(ClientDialect):
    name = "chat"
    path = "/v1/chat/completions"
    id_prefix = "chatcmpl-"
    kind = CHAT
    fields = _CHAT_TABLE

    def __init__(self, settings: Settings, store: StateStore) -> None:
        super().__init__(settings, store)
        # `client.usage_fields`, looked up once: what the usage chat clients get goes through (None: as it is).
        self.usage_fields = dialect_usage_fields(settings.client.usage_fields)

    async def decode(self, body: dict[str, Any]) -> ClientCall:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise ClientRequestError("`model` is required and must be a non-empty string.", param="model")
        self._check(body)
        check_types(body, self.fields)
        stream = body.get("stream") is True
        opts = body.get("stream_options")
        include_usage = stream and isinstance(opts, dict) and opts.get("include_usage") is True
        return ClientCall(body, self.kind, model, stream, {"include_usage": include_usage})

    def _check(self, body: dict[str, Any]) -> None:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ClientRequestError("`messages` must be a non-empty list.", param="messages")

    def encoder(self, call: ClientCall, ctx: RequestContext, answer: Answer) -> Encoder:
        client = self.settings.client
        return ChatEncoder(
            ctx,
            answer,
            call.stream,
            call.options["include_usage"],
            client.reasoning,
            self.usage_fields,
            self.kind == CHAT,
        )

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


class ChatEncoder:
    keepalive = KEEPALIVE

    def __init__(
        self,
        ctx: RequestContext,
        answer: Answer,
        stream: bool,
        include_usage: bool,
        reasoning: str,
        usage_fields: Callable[[dict[str, Any]], dict[str, Any]] | None,
        chat: bool,
    ) -> None:
        self.ctx = ctx
        self.answer = answer
        self.stream = stream
        self.include_usage = include_usage
        self.reasoning = reasoning
        self.usage_fields = usage_fields
        self.chat = chat
        self._object = ("chat.completion.chunk" if stream else "chat.completion") if chat else "text_completion"
        self._id: str | None = None
        self._think_open: set[int] = set()  # think_tags: choices whose "<think>" was sent, "</think>" not yet
        self._folds: dict[int, _Fold] = {}
        # The hot path (a chunk that only adds text to one choice) is built from cached bytes: the envelope up to
        # the choice's index, and what follows the delta (`_tail`). Rebuilt when the envelope's extra fields change.
        self._head = b""
        self._tail = b""
        self._close = b""
        # Per choice index, everything up to the value of the delta's one field (or `text`), from `_head`.
        self._text_heads: dict[int, bytes] = {}
        self._reasoning_heads: dict[int, bytes] = {}
        self._extra_seen: dict[str, Any] | None = None
        # The delta key the hot path may use for reasoning (None: reasoning takes the general path).
        self._reasoning_key = {"reasoning_content": b'"reasoning_content":', "reasoning": b'"reasoning":'}.get(
            reasoning
        )

    # -- the Encoder protocol -----------------------------------------------------------------------------------
    def head(self) -> bytes:
        return b""

    def feed(self, deltas: Sequence[Delta | TextRun]) -> bytes:
        if not self.stream:
            for d in deltas:
                if type(d) is TextRun:
                    for one in d.deltas():
                        self._fold(one)
                else:
                    self._fold(d)
            return b""
        # One chunk per event: choices of one upstream chunk go out one by one, as OpenAI sends n > 1 streams.
        if self._extra_seen != self.answer.envelope_extra:
            self._prefixes()
        out: list[bytes] = []
        for d in deltas:
            if type(d) is TextRun:
                self._run(d, out)
                continue
            # The common event adds text to a choice and nothing else: cached bytes around the one dumped string,
            # byte for byte what the general path below produces (tests/clients/test_chat_encoder.py).
            if not (d.first or d.tool_calls or d.finish_reason is not None or d.logprobs is not None or d.extra
                    or d.choice_extra):
                if not self.chat:
                    head = self._text_heads.get(d.index) or self._cache(self._text_heads, d.index, b'"text":')
                    out.append(head + dumps_text(d.content) + self._tail)
                    continue
                if not d.reasoning:
                    if d.content and (d.index not in self._think_open):
                        head = self._text_heads.get(d.index) or self._cache(
                            self._text_heads, d.index, b'"delta":{"content":')
                        out.append(head + dumps_text(d.content) + self._close)
                        continue
                elif not d.content and self._reasoning_key is not None:
                    head = self._reasoning_heads.get(d.index) or self._cache(
                        self._reasoning_heads, d.index, b'"delta":{' + self._reasoning_key)
                    out.append(head + dumps_text(d.reasoning) + self._close)
                    continue
            out.append(self._chunk(d))
        return b"".join(out)

    def _run(self, run: TextRun, out: list[bytes]) -> None:
        """A TextRun: one chunk per text, as `feed` writes each of its Deltas (plain text: the hot path), in one
        loop; a run the hot path would not take (reasoning without a delta key, inside a `<think>` tag, a
        Completions stream) goes through `feed` as its Deltas."""
        index = run.index
        if not self.chat:
            out.append(self.feed(run.deltas()))
            return
        if run.reasoning:
            if self._reasoning_key is None:
                out.append(self.feed(run.deltas()))
                return
            head = self._reasoning_heads.get(index) or self._cache(
                self._reasoning_heads, index, b'"delta":{' + self._reasoning_key)
        elif index in self._think_open:
            out.append(self.feed(run.deltas()))
            return
        else:
            head = self._text_heads.get(index) or self._cache(self._text_heads, index, b'"delta":{"content":')
        # One chunk per text, head + text + close each: written as the texts' JSON strings joined by close + head,
        # between head and close (the same bytes in one piece: proxy/hub/jsontext.py dumps_joined).
        close = self._close
        out.append(dumps_joined(run.texts, close + head, head, close))

    def _cache(self, heads: dict[int, bytes], index: int, key: bytes) -> bytes:
        """The bytes of a hot-path chunk of choice `index` up to the value of `key` (kept until the envelope
        changes)."""
        head = heads[index] = b"%s%d,%s" % (self._head, index, key)
        return head

    def _chunk(self, d: Delta) -> bytes:
        """The general path: one event -> one framed chunk."""
        make = self._chat_choice if self.chat else self._text_choice
        return encode_data(orjson.dumps(self._envelope([make(d)])))

    def _prefixes(self) -> None:
        extra = self.answer.envelope_extra
        self._extra_seen = dict(extra)
        envelope = orjson.dumps({"id": self._response_id(), "object": self._object, "created": self.ctx.created,
                                 "model": self.ctx.response_model})
        self._head = b"data: " + envelope[:-1] + b',"choices":[{"index":'
        rest: dict[str, Any] = dict(extra)
        if self.include_usage:
            rest["usage"] = None
        after = b"," + orjson.dumps(rest)[1:] if rest else b"}"
        self._tail = b',"logprobs":null,"finish_reason":null}]' + after + b"\n\n"
        self._close = b"}" + self._tail  # after the one value of a delta object
        self._text_heads.clear()
        self._reasoning_heads.clear()

    def finish(self) -> bytes:
        if not self.stream:
            return orjson.dumps(self._folded())
        if not self.include_usage:
            return DONE
        final = self._envelope([])
        final["usage"] = self._usage() or dict(_ZERO_USAGE)
        return encode_data(orjson.dumps(final)) + DONE

    def error(self, err: ProxyError) -> bytes:
        return encode_data(err.body())

    # -- streams --------------------------------------------------------------------------------------------------
    def _chat_choice(self, d: Delta) -> dict[str, Any]:
        out_delta: dict[str, Any] = {"role": "assistant"} if d.first else {}
        content = self._format(d, out_delta)
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

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self._response_id(),
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

    def _response_id(self) -> str:
        if self._id is None:
            upstream_id = self.answer.upstream_id
            self._id = upstream_id if upstream_id and self.ctx.upstream.keep_upstream_id else self.ctx.response_id
        return self._id

    def _usage(self) -> dict[str, Any] | None:
        usage = self.answer.usage
        if usage is not None and self.usage_fields is not None:
            return self.usage_fields(usage)
        return usage

    # -- non-stream: the same events, folded --------------------------------------------------------------------
    def _fold(self, d: Delta) -> None:
        f = self._folds.get(d.index)
        if f is None:
            f = self._folds[d.index] = _Fold()
        if self.chat:
            out: dict[str, Any] = {}
            content = self._format(d, out)
            reasoning = out.get("reasoning_content") or out.get("reasoning")
            if reasoning:
                f.reasoning.append(reasoning)
        else:
            content = d.content
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

    def _folded(self) -> dict[str, Any]:
        choices = []
        for index in sorted(self._folds):
            f = self._folds[index]
            text = "".join(f.content)
            if self.chat:
                calls = [f.tool_calls[i] for i in sorted(f.tool_calls)]
                message: dict[str, Any] = {"role": "assistant"}
                message["content"] = text if text else (None if calls or f.extra.get("refusal") else "")
                if f.reasoning:
                    key = "reasoning" if self.reasoning == "reasoning" else "reasoning_content"
                    message[key] = "".join(f.reasoning)
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
            "id": self._response_id(),
            "object": self._object,
            "created": self.ctx.created,
            "model": self.ctx.response_model,
            "choices": choices,
        }
        result.update(self.answer.envelope_extra)
        usage = self._usage()
        if usage is not None:
            result["usage"] = usage
        return result


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
