"""Per-request response translation: canonical upstream chunks in, client chunks out.

One `ResponseTranslator` per request holds the stream state (envoy ai-gateway style) and composes the pure
transforms of proxy/stream per choice:

    content ─▶ CumulativeText (full-text upstreams) ─▶ ThinkSplitter (inline <think>) ─┐
    reasoning_content / reasoning (field) ─────────────────────────────────────────────┼▶ client reasoning format
    tool_calls ─▶ ToolCallNormalizer ──────────────────────────────────────────────────┘   (DECISIONS "Reasoning")
    usage ─▶ normalize_usage ─▶ held until the end; sent per stream_options.include_usage

Streaming and non-streaming share this path: a non-stream answer is each choice's message run through the same
per-choice processing with `final=True` (DESIGN.md "Streaming and non-streaming share one path").
"""

from __future__ import annotations

import logging
import re
from typing import Any

from .canonical import CHAT, ChatChunk, ChatCompletion, RequestContext, Usage
from .errors import StreamTruncated, UpstreamError
from .settings import ClientSettings
from .stream.cumulative import CumulativeText
from .stream.think import ThinkSplitter
from .stream.tool_calls import ToolCallNormalizer, normalize_message_tool_calls
from .stream.usage import deepseek_usage_fields, normalize_usage

log = logging.getLogger("dialect_proxy")

# DECISIONS.md: models whose template opens the thinking block in the prompt (DeepSeek-R1 family).
THINKING_MODEL_RE = re.compile(r"(?i)(^|[^a-z0-9])r1([^a-z0-9]|$)|reasoner")

# Finish reasons that say the upstream broke the generation off, not that the answer is complete
# (docs/deepseek-engine.md): a retryable error instead of a finish_reason — the whole answer for non-stream
# requests; for streams an error event after the partial content, without [DONE].
ERROR_FINISH_REASONS: dict[str, tuple[int, str]] = {
    "insufficient_system_resource": (
        503, ("The upstream interrupted the generation for lack of system resources "
              "(finish_reason `insufficient_system_resource`)"),
    ),
}


def finish_error(finish: str, stream: bool) -> UpstreamError:
    status, text = ERROR_FINISH_REASONS[finish]
    if stream:
        return StreamTruncated(text + "; the answer streamed so far is incomplete. Retry the request.",
                               reason="upstream_error", status=status, code=finish, upstream_code=finish)
    return UpstreamError(text + "; the partial answer was discarded. Retry the request.", status, code=finish,
                         upstream_code=finish)


_DELTA_OWN = frozenset({"role", "content", "reasoning_content", "reasoning", "tool_calls"})
_CHUNK_OWN = frozenset({"id", "object", "created", "model", "choices", "usage"})


def starts_in_reasoning(ctx: RequestContext) -> bool:
    if THINKING_MODEL_RE.search(ctx.upstream_model):
        return True  # R1-family templates always open <think>: they have no switch to turn thinking off
    # A listed (often hybrid) model does not open the block when the client switched thinking off (the MindIE
    # dialect records chat_template_kwargs.enable_thinking: false in ctx.extras).
    return ctx.upstream_model in ctx.upstream.thinking_models and ctx.extras.get("enable_thinking") is not False


class _Choice:
    __slots__ = ("cumulative", "splitter", "tools", "role_sent", "finished", "field_mode", "think_open")

    def __init__(self, cumulative: bool, splitter: ThinkSplitter | None) -> None:
        self.cumulative = CumulativeText() if cumulative else None
        self.splitter = splitter
        self.tools: ToolCallNormalizer | None = None
        self.role_sent = False
        self.finished = False
        self.field_mode = False
        self.think_open = False  # think_tags output: "<think>" sent, "</think>" not yet


class ResponseTranslator:
    def __init__(self, ctx: RequestContext, client: ClientSettings, reasoning_source: str) -> None:
        self.ctx = ctx
        self.client_reasoning = client.reasoning
        self.deepseek_usage = client.usage_fields == "deepseek"
        self.source = reasoning_source
        self.chat = ctx.kind == CHAT
        self.usage: Usage | None = None
        self.usage_extras: dict[str, Any] = {}
        self.full_text: str | None = None  # MindIE's trailing `full_text` of the chunk being fed (via ctx.extras)
        self.full_text_mismatch = False  # the client's cumulative-mode text differs from the upstream's full_text
        self.rewrites = 0
        self._keep_id = ctx.upstream.keep_upstream_id  # until the first upstream id is taken
        self._warned_full_text = False
        self.last_finish_reason: str | None = None
        self._choices: dict[int, _Choice] = {}
        self._start_in_reasoning = starts_in_reasoning(ctx) if self.source in ("auto", "tags") else False
        self._object = "chat.completion.chunk" if self.chat else "text_completion"
        self._envelope_extra: dict[str, Any] = {}
        self._pending_error: UpstreamError | None = None  # an error finish reason, raised by finish()

    # -- per-choice state ------------------------------------------------------------------------------------
    def _choice(self, index: int, stream: bool) -> _Choice:
        st = self._choices.get(index)
        if st is None:
            splitter = None
            if self.chat and self.source in ("auto", "tags"):
                splitter = ThinkSplitter(self._start_in_reasoning)
            st = _Choice(stream and self.ctx.upstream.full_text, splitter)
            self._choices[index] = st
        return st

    def _text(self, st: _Choice, content: str | None, reasoning: str | None, final: bool) -> tuple[str, str]:
        """New (reasoning, content) text of one choice: cumulative -> true delta, inline tags -> reasoning."""
        if reasoning is not None and self.source == "auto" and not st.field_mode:
            st.field_mode = True  # DECISIONS: a reasoning field puts the response in field mode
            if st.splitter is not None:
                held = st.splitter.flush()
                st.splitter = None
                r0 = "".join(s for k, s in held if k == "reasoning")
                c0 = "".join(s for k, s in held if k == "content")
                r, c = self._text(st, content, reasoning, final)
                return r0 + r, c0 + c
        if content and st.cumulative is not None:
            content = st.cumulative.feed(content)
        if final and st.cumulative is not None:
            content = (content or "") + st.cumulative.flush(self.full_text)
            self.rewrites += st.cumulative.rewrites
            if st.cumulative.mismatch:
                self.full_text_mismatch = True
                log.warning("upstream %s: streamed text differs from its final full_text (%d rewrites); the "
                            "client keeps what it was sent", self.ctx.upstream.name, st.cumulative.rewrites)
        r_parts = [reasoning] if reasoning else []
        c_parts: list[str] = []
        splitter = st.splitter
        if splitter is not None:
            pieces = splitter.feed(content) if content else []
            if final:
                pieces = pieces + splitter.flush()
            for kind, s in pieces:
                (r_parts if kind == "reasoning" else c_parts).append(s)
        elif content:
            c_parts.append(content)
        return "".join(r_parts), "".join(c_parts)

    def _format_reasoning(self, st: _Choice, out: dict[str, Any], reasoning: str, content: str,
                          final: bool) -> str:
        """Put reasoning where the client wants it; returns the (maybe re-inlined) content."""
        mode = self.client_reasoning
        if mode == "think_tags":
            if reasoning:
                content_prefix = "" if st.think_open else "<think>"
                st.think_open = True
                content_prefix += reasoning
            else:
                content_prefix = ""
            if st.think_open and (content or final):
                content_prefix += "</think>\n\n"
                st.think_open = False
            return content_prefix + content
        if reasoning:
            if mode == "reasoning_content":
                out["reasoning_content"] = reasoning
            elif mode == "reasoning":
                out["reasoning"] = reasoning
        return content

    # -- streams ---------------------------------------------------------------------------------------------
    def feed(self, chunk: ChatChunk) -> list[ChatChunk]:
        """One canonical upstream chunk -> zero or one client chunk."""
        if self._keep_id:
            self._take_id(chunk.get("id"))
        if self.ctx.extras or self.full_text is not None:
            self._take_full_text()
        usage = chunk.get("usage")
        if usage:
            self._take_usage(usage)
        if not _CHUNK_OWN.issuperset(chunk):  # fields we do not know (system_fingerprint, vendor extras) pass
            for key, value in chunk.items():
                if key not in _CHUNK_OWN:
                    self._envelope_extra[key] = value
        out_choices = []
        for choice in chunk.get("choices") or ():
            out = self._stream_choice(choice)
            if out is not None:
                out_choices.append(out)
        if not out_choices:
            return []
        return [self._envelope(out_choices)]

    def _stream_choice(self, choice: dict[str, Any]) -> dict[str, Any] | None:
        index = choice.get("index") or 0
        st = self._choice(index, True)
        if st.finished:
            return None
        finish = choice.get("finish_reason")
        final = finish is not None
        broken = finish in ERROR_FINISH_REASONS  # final for the text, but no finish_reason for the client
        if self.chat:
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content")
            if reasoning is None:
                reasoning = delta.get("reasoning")
            r, c = self._text(st, delta.get("content"), reasoning, final)
            out_delta: dict[str, Any] = {}
            first = not st.role_sent
            if first:
                out_delta["role"] = delta.get("role") or "assistant"
            c = self._format_reasoning(st, out_delta, r, c, final)
            payload = len(out_delta) > first  # a reasoning field was added
            if c:
                out_delta["content"] = c
                payload = True
            elif first and not payload:
                out_delta["content"] = ""
            tool_calls = delta.get("tool_calls")
            if tool_calls or (final and st.tools is not None):
                if st.tools is None:
                    st.tools = ToolCallNormalizer()
                normalized = st.tools.feed(tool_calls) if tool_calls else []
                if final:
                    normalized += st.tools.flush()
                if normalized:
                    out_delta["tool_calls"] = normalized
                    payload = True
            if not _DELTA_OWN.issuperset(delta):  # fields we do not know (refusal, audio, vendor extras) pass
                for key, value in delta.items():
                    if key not in _DELTA_OWN:
                        out_delta[key] = value
                        payload = True
            if not (payload or (final and not broken) or first or choice.get("logprobs") is not None):
                if broken:
                    self._break(st, finish)
                return None
            st.role_sent = True
            out: dict[str, Any] = {"index": index, "delta": out_delta}
        else:
            r, c = self._text(st, choice.get("text"), None, final)
            if not c and (not final or broken) and len(choice) <= 4:
                if broken:
                    self._break(st, finish)
                return None
            out = {"index": index, "text": c}
        for key, value in choice.items():
            if key not in ("index", "delta", "text", "finish_reason"):
                out[key] = value
        out.setdefault("logprobs", None)
        out["finish_reason"] = None if broken else finish
        if broken:
            self._break(st, finish)
        elif final:
            st.finished = True
            self.last_finish_reason = finish
        return out

    def _break(self, st: _Choice, finish: Any) -> None:
        st.finished = True  # later deltas of this choice are dropped; finish() raises the error
        if self._pending_error is None:
            self._pending_error = finish_error(str(finish), stream=True)

    def finish(self, saw_done: bool) -> list[ChatChunk]:
        """End of the upstream stream. Raises StreamTruncated if the answer is not complete."""
        if self._pending_error is not None:
            raise self._pending_error
        if not self._choices or not all(st.finished for st in self._choices.values()):
            if not saw_done:
                raise StreamTruncated(
                    "The upstream closed the stream before the answer was complete.", reason="upstream_closed"
                )
            raise StreamTruncated(
                "The upstream ended the stream without a finish_reason; the answer may be incomplete.",
                reason="upstream_closed",
            )
        if not self.ctx.include_usage:
            return []
        usage = self.usage if self.usage is not None else {
            "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0,
        }
        final = self._envelope([])
        final["usage"] = usage
        return [final]

    def _envelope(self, choices: list[dict[str, Any]]) -> ChatChunk:
        ctx = self.ctx
        out: ChatChunk = {
            "id": ctx.response_id,
            "object": self._object,
            "created": ctx.created,
            "model": ctx.response_model,
            "choices": choices,
        }
        if self._envelope_extra:
            out.update(self._envelope_extra)
        if ctx.include_usage:
            out["usage"] = None
        return out

    def _take_id(self, upstream_id: Any) -> None:
        """`keep_upstream_id`: the first upstream id becomes the response id."""
        if isinstance(upstream_id, str) and upstream_id:
            self.ctx.response_id = upstream_id
        self._keep_id = False

    def _take_full_text(self) -> None:
        """MindIE's `full_text` rides on the chunk that finishes a choice; the dialect strips it into ctx.extras. It
        is this chunk's final check (CumulativeText.flush), never forwarded, and not kept for the next chunk."""
        value = self.ctx.extras.pop("full_text", None)
        self.full_text = value if isinstance(value, str) else None
        if value is not None and not self.ctx.upstream.full_text and not self._warned_full_text:
            self._warned_full_text = True
            log.warning("upstream %s sends full_text (MindIE fullTextEnabled) but is not configured with "
                        "full_text: true; streamed text will repeat itself", self.ctx.upstream.name)

    def _take_usage(self, raw: dict[str, Any]) -> None:
        usage, extras = normalize_usage(raw)
        if extras:
            self.usage_extras.update(extras)
        self.usage = deepseek_usage_fields(usage) if self.deepseek_usage else usage

    # -- non-stream ------------------------------------------------------------------------------------------
    def translate_completion(self, data: ChatCompletion) -> ChatCompletion:
        ctx = self.ctx
        if self._keep_id:
            self._take_id(data.get("id"))
        choices = []
        for choice in data.get("choices") or ():
            if choice.get("finish_reason") in ERROR_FINISH_REASONS:
                raise finish_error(choice["finish_reason"], stream=False)
            index = choice.get("index") or 0
            st = self._choice(index, False)
            out = {k: v for k, v in choice.items() if k not in ("message", "text", "finish_reason", "index")}
            if self.chat:
                msg = choice.get("message") or {}
                reasoning = msg.get("reasoning_content")
                if reasoning is None:
                    reasoning = msg.get("reasoning")
                r, c = self._text(st, msg.get("content"), reasoning, True)
                new_msg: dict[str, Any] = {"role": msg.get("role") or "assistant"}
                c = self._format_reasoning(st, new_msg, r, c, True)
                tool_calls = normalize_message_tool_calls(msg.get("tool_calls"))
                new_msg["content"] = None if (tool_calls and not c) else c
                if msg.get("content") is None and not c and not tool_calls:
                    new_msg["content"] = None if msg.get("refusal") else ""
                if tool_calls:
                    new_msg["tool_calls"] = tool_calls
                for key, value in msg.items():
                    if key not in _DELTA_OWN:
                        new_msg[key] = value
                # Keep reasoning fields right after content for readability of raw JSON.
                for key in ("reasoning_content", "reasoning"):
                    if key in new_msg:
                        new_msg[key] = new_msg.pop(key)
                out = {"index": index, "message": new_msg, **out}
            else:
                _, c = self._text(st, choice.get("text"), None, True)
                out = {"index": index, "text": c, **out}
            out.setdefault("logprobs", None)
            out["finish_reason"] = choice.get("finish_reason")
            choices.append(out)
        result: ChatCompletion = {
            "id": ctx.response_id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": ctx.created,
            "model": ctx.response_model,
            "choices": choices,
        }
        for key, value in data.items():
            if key not in _CHUNK_OWN:
                result[key] = value
        if data.get("usage"):
            self._take_usage(data["usage"])
        if self.usage is not None:
            result["usage"] = self.usage
        return result
