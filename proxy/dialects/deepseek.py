"""The DeepSeek API (specs/deepseek-chat-completions-zh.md, WIRE-NOTES.md "DeepSeek API").

What differs from OpenAI, and where it is handled:

- parameter bounds (max_tokens 1..8192, stop <= 16, tools <= 128, ranges): mappings/deepseek.yaml;
- reasoning replay (DECISIONS.md "DeepSeek reasoning replay"): `reasoning_content` / `reasoning` on assistant
  turns is removed, except on turns that made tool calls, where thinking-mode models require it (renamed to
  `reasoning_content`). `reasoning_replay: strip | keep` overrides per upstream. Reasoning a `think_tags` client
  round-trips inside `content` (`<think>…</think>answer`) is taken out of the content first, so it is replayed
  (or stripped) like a field;
- messages: `developer` becomes `system` and text-only content parts one string (DeepSeek's four roles take
  string content);
- R1-era models (`deepseek-reasoner`, any upstream name matching the R1 pattern): successive same-role messages are
  merged, `logprobs` / `top_logprobs` are refused by us with a clear 400;
- thinking: `reasoning_effort` becomes `thinking: {"type": "enabled" | "disabled"}` unless the client sent
  `thinking`; a forced `tool_choice` (`required` or a named function) turns thinking off for that request, because
  DeepSeek refuses the combination;
- DeepSeek-dialect clients: the assistant `prefix: true` continuation is sent to the `/beta` route it needs;
- `insufficient_system_resource` is turned into a retryable 503 by the upstream session (proxy/dialects/base.py),
  so that an interrupted answer never looks like a normal `stop`.

Responses are OpenAI-shaped already (`reasoning_content`, usage cache fields handled by proxy/stream/usage.py).
"""

from __future__ import annotations

from typing import Any

from ..canonical import CHAT, ChatRequest, RequestContext
from ..errors import ClientRequestError
from .base import THINKING_MODEL_RE, Dialect, UpstreamSession, join_text_parts

RESPONSE_FORMATS = ("text", "json_object")
# OpenAI `reasoning_effort` -> DeepSeek `thinking.type` (DeepSeek has an on/off switch, no effort levels).
THINKING_BY_EFFORT = {
    "none": "disabled",
    "minimal": "disabled",
    "low": "enabled",
    "medium": "enabled",
    "high": "enabled",
    "xhigh": "enabled",
}
BETA = "/beta"


def is_r1(model: str) -> bool:
    """R1-era reasoner: `deepseek-reasoner`, `DeepSeek-R1`, ... (the pattern of DECISIONS.md "Reasoning")."""
    return bool(THINKING_MODEL_RE.search(model))


class DeepSeekSession(UpstreamSession):
    def build_request(self, body: ChatRequest) -> dict[str, Any]:
        out = super().build_request(body)
        thinking = out.get("thinking")
        self.thinking_off = isinstance(thinking, dict) and thinking.get("type") == "disabled"
        return out


class DeepSeekDialect(Dialect):
    name = "deepseek"
    session_class = DeepSeekSession
    default_reasoning_source = "field"
    supports_prefix = True

    # -- requests ---------------------------------------------------------------------------------------------
    def build_request(self, body: ChatRequest, ctx: RequestContext) -> dict[str, Any]:
        out = super().build_request(body, ctx)
        if not ctx.stream:
            out.pop("stream_options", None)  # "只有在 stream 参数为 true 时,才可设置此参数"
        if ctx.kind != CHAT:
            return out
        r1 = is_r1(ctx.upstream_model)
        _check_n(out)
        _check_response_format(out)
        if r1:
            _refuse_logprobs(out, ctx.upstream_model)
        _map_thinking(out, r1)
        thinking = _thinking_enabled(out)
        messages = [_split_inline_reasoning(_plain(m)) for m in out["messages"]]
        messages = [
            _replay(m, ctx.upstream.reasoning_replay, i == len(messages) - 1, thinking) for i, m in enumerate(messages)
        ]
        if r1:
            messages = merge_successive(messages)
        out["messages"] = messages
        return out

    def request_path(self, path: str, body: dict[str, Any], ctx: RequestContext) -> str:
        """The assistant-prefix continuation and FIM completion are served under /beta only."""
        beta = path.startswith(BETA + "/")
        if not beta and ctx.kind == CHAT and _has_prefix(body):
            path, beta = BETA + path, True
        if beta and ctx.upstream.url.endswith(BETA):
            path = path[len(BETA) :]
        return path


# -- request helpers (pure functions of the request) ---------------------------------------------------------


def _check_n(out: dict[str, Any]) -> None:
    n = out.get("n")
    if n is None or n == 1:
        out.pop("n", None)
        return
    raise ClientRequestError(
        f"`n` = {n!r} is not supported by DeepSeek, which returns one choice per request; "
        "send n = 1 (or omit it) and repeat the request for more answers.",
        param="n",
    )


def _check_response_format(out: dict[str, Any]) -> None:
    fmt = out.get("response_format")
    if fmt is None:
        return
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in RESPONSE_FORMATS:
        hint = ' Use {"type": "json_object"} and describe the schema in the prompt.' if kind == "json_schema" else ""
        raise ClientRequestError(
            f"`response_format` type {kind!r} is not supported by DeepSeek (it accepts `text` and `json_object`)."
            + hint,
            param="response_format",
        )


def _refuse_logprobs(out: dict[str, Any], model: str) -> None:
    if out.get("logprobs") or out.get("top_logprobs") is not None:
        param = "logprobs" if out.get("logprobs") else "top_logprobs"
        raise ClientRequestError(
            f"`logprobs` and `top_logprobs` are not supported by the reasoning model `{model}` (DeepSeek R1 "
            "models refuse them); remove them.",
            param=param,
        )
    out.pop("logprobs", None)
    out.pop("top_logprobs", None)


def _forced_tool_choice(choice: Any) -> bool:
    return choice == "required" or isinstance(choice, dict)


def _map_thinking(out: dict[str, Any], r1: bool) -> None:
    effort = out.pop("reasoning_effort", None)
    if "thinking" not in out and not r1 and isinstance(effort, str) and effort in THINKING_BY_EFFORT:
        out["thinking"] = {"type": THINKING_BY_EFFORT[effort]}
    if _thinking_enabled(out) and out.get("tools") and _forced_tool_choice(out.get("tool_choice")):
        # DeepSeek refuses a forced tool_choice in thinking mode; the forced call is what the client needs.
        out["thinking"] = {**out["thinking"], "type": "disabled"}


def _thinking_enabled(out: dict[str, Any]) -> bool:
    thinking = out.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") == "enabled"


def _has_prefix(body: dict[str, Any]) -> bool:
    messages = body.get("messages")
    return isinstance(messages, list) and any(isinstance(m, dict) and m.get("prefix") is True for m in messages)


def _plain(message: Any) -> Any:
    """DeepSeek knows four roles and string content: `developer` -> `system`, text-only content parts -> a string."""
    if not isinstance(message, dict):
        return message
    role = message.get("role")
    content = message.get("content")
    joined = join_text_parts(content)
    if role != "developer" and joined is content:
        return message
    out = dict(message)
    if role == "developer":
        out["role"] = "system"
    out["content"] = joined
    return out


def _split_inline_reasoning(message: Any) -> Any:
    """`<think>r</think>answer` in an assistant's content (a think_tags client round-tripping) -> field + content."""
    if not isinstance(message, dict) or message.get("role") != "assistant":
        return message
    content = message.get("content")
    if not isinstance(content, str):
        return message
    stripped = content.lstrip()
    if not stripped.startswith("<think>"):
        return message
    end = stripped.find("</think>")
    if end < 0:
        return message
    out = dict(message)
    reasoning = stripped[len("<think>") : end]
    out["content"] = stripped[end + len("</think>") :].lstrip()
    if out.get("reasoning_content") is None and out.get("reasoning") is None:
        out["reasoning_content"] = reasoning
    return out


def _replay(message: Any, policy: str, last: bool, thinking: bool) -> Any:
    """Reasoning on one input message, per DECISIONS.md "DeepSeek reasoning replay"."""
    if not isinstance(message, dict):
        return message
    if message.get("role") != "assistant":
        if "reasoning_content" in message or "reasoning" in message:
            message = {k: v for k, v in message.items() if k not in ("reasoning_content", "reasoning")}
        return message
    reasoning = message.get("reasoning_content")
    if reasoning is None:
        reasoning = message.get("reasoning")
    out = {k: v for k, v in message.items() if k not in ("reasoning_content", "reasoning")}
    tool_turn = bool(message.get("tool_calls"))
    # The beta prefix continuation takes the reasoning of the message being continued as input.
    keep = (last and message.get("prefix") is True) or policy == "keep" or (policy == "auto" and tool_turn)
    if keep and isinstance(reasoning, str):
        out["reasoning_content"] = reasoning
    elif keep and tool_turn and thinking and policy != "strip":
        # A client that never received the reasoning (client.reasoning: none) cannot send it back; thinking mode
        # refuses a tool-call turn without it. An empty reasoning is the honest value.
        out["reasoning_content"] = ""
    return out


def merge_successive(messages: list[Any]) -> list[Any]:
    """Merge runs of user (or assistant, or system) messages: R1-era models refuse successive same-role messages."""
    merged: list[Any] = []
    for message in messages:
        prev = merged[-1] if merged else None
        if (
            isinstance(message, dict)
            and isinstance(prev, dict)
            and message.get("role") == prev.get("role")
            and message.get("role") in ("user", "assistant", "system")
        ):
            merged[-1] = _merge_two(prev, message)
        else:
            merged.append(message)
    return merged


def _merge_two(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    out["content"] = _join_content(a.get("content"), b.get("content"))
    if b.get("tool_calls"):
        out["tool_calls"] = list(a.get("tool_calls") or ()) + list(b["tool_calls"])
    for key in ("reasoning_content",):
        ra, rb = a.get(key), b.get(key)
        if isinstance(rb, str):
            out[key] = (ra + "\n\n" + rb) if isinstance(ra, str) and ra else rb
    if b.get("prefix") is True:
        out["prefix"] = True
    for key, value in b.items():  # fields only the later message has (name, ...)
        out.setdefault(key, value)
    return out


def _join_content(a: Any, b: Any) -> Any:
    if a is None or a == "":
        return b
    if b is None or b == "":
        return a
    if isinstance(a, str) and isinstance(b, str):
        return a + "\n\n" + b
    return _parts(a) + _parts(b)


def _parts(content: Any) -> list[Any]:
    if isinstance(content, list):
        return list(content)
    return [{"type": "text", "text": str(content)}]
