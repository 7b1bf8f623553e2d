"""The DeepSeek API as it is today (docs/deepseek.md; docs/upstreams.md "DeepSeek API" for what its reference and its
observed behaviour say of the fields they cover).

Models: `deepseek-flash` (V4.1 Flash; `deepseek-v4-flash` still accepted) and `deepseek-v4-pro`, thinking mode on by
default. The retired names `deepseek-chat` / `deepseek-reasoner` depend on the upstream's own model list
(proxy/gateway/catalog.py, read once and cached): a name the upstream lists goes through unchanged, under the rules of
the API that serves it — the seed document's (docs/upstreams.md "DeepSeek API"): `deepseek-chat` without a thinking
mode, `deepseek-reasoner` an R1-era reasoner. A name it does not list, or any name when the list cannot be read,
behaves as DeepSeek defined it at the end: `deepseek-chat` is `deepseek-v4-flash` with thinking disabled,
`deepseek-reasoner` the same with thinking enabled (the upstream gets the V4 name). Otherwise R1-era rules apply only
to names matching the R1 pattern (`is_r1_era`: a DeepSeek-compatible host serving R1) or where the upstream says
`reasoning_replay: strip`.

What differs from OpenAI, and where it is handled:

- parameter bounds (max_tokens, stop <= 16, tools <= 128, ranges): mappings/deepseek.yaml;
- thinking: `thinking: {"type": "enabled" | "disabled"}` switches it; OpenAI's `reasoning_effort` grades it
  (`low`/`high`/`max`: `minimal` -> low, `medium` -> high, `xhigh` -> max; `none` switches thinking off). A forced
  `tool_choice` (`required` or a named function) turns thinking off for that request, because DeepSeek refuses the
  combination. In thinking mode DeepSeek ignores temperature, top_p and the penalties (sent as given);
- reasoning replay (`reasoning_replay`, proxy/hub/continuity.py): in thinking mode every assistant turn that made tool
  calls must carry its `reasoning_content` ("The `reasoning_content` in the thinking mode must be passed back to
  the API."); `auto` is `restore` here — the hub puts back what a client dropped, and a fixed non-empty placeholder
  on a turn it never saw (`reasoning_fallback`, REASONING_PLACEHOLDER). Reasoning on turns without tool calls is
  removed (DeepSeek ignores it there), `reasoning` is renamed `reasoning_content`, and reasoning a `think_tags`
  client round-trips inside `content` (`<think>…</think>answer`) is taken out of the content first. R1-era models:
  `auto` is `strip`;
- messages: `developer` becomes `system` and text-only content parts one string (DeepSeek's four roles take
  string content);
- R1-era models: successive same-role messages are merged, `logprobs` / `top_logprobs` are refused by us with a
  clear 400, and no `thinking` / `reasoning_effort` is sent (R1 always reasons);
- DeepSeek-dialect clients: the assistant `prefix: true` continuation is sent to the `/beta` route it needs;
- `insufficient_system_resource` is turned into a retryable 503 by the upstream session (proxy/dialects/base.py),
  so that an interrupted answer never looks like a normal `stop`.

Responses are OpenAI-shaped already (`reasoning_content`, usage cache fields handled by proxy/stream/usage.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from proxy.dialects.base import Dialect, RequestRules, UpstreamSession, join_text_parts
from proxy.dialects.probing import Probe, ProbeListing
from proxy.dialects.templates import is_r1_era
from proxy.errors import ClientRequestError
from proxy.hub.canonical import CHAT, ChatRequest, RequestContext
from proxy.hub.structured import StructuredCaps
from proxy.stream.usage import deepseek_usage_fields

RESPONSE_FORMATS: Final = ("text", "json_object")
# OpenAI `reasoning_effort` -> DeepSeek's effort (low / high / max), as DeepSeek maps them; `none` disables thinking.
EFFORTS: Final = {"minimal": "low", "low": "low", "medium": "high", "high": "high", "xhigh": "max", "max": "max"}
# Retired on 2026-07-24; until then aliases of V4 Flash's two modes. Name -> its thinking type (model: RETIRED_TARGET).
RETIRED_MODELS: Final = {"deepseek-chat": "disabled", "deepseek-reasoner": "enabled"}
RETIRED_TARGET: Final = "deepseek-v4-flash"
# The retired reasoner, where an upstream still lists it, is the seed document's: R1.
RETIRED_R1: Final = "deepseek-reasoner"
# The reasoning of a thinking-mode tool-call turn the proxy never saw (docs/deepseek.md "Reasoning continuity"):
# DeepSeek refuses such a turn without `reasoning_content`, and reports differ on whether an empty string passes its
# check, so the value is fixed, non-empty and says what it is — never text a client made up
# (docs/decisions.md "Client dialects and state").
REASONING_PLACEHOLDER: Final = "(reasoning not available)"
BETA: Final = "/beta"


def is_r1(model: str) -> bool:
    """R1-era reasoner (`DeepSeek-R1`, `deepseek-r1-distill-…`): not `deepseek-reasoner`, see above."""
    return is_r1_era(model)


def thinking_on(body: dict[str, Any], model: str, served: bool = False) -> bool:
    """Whether DeepSeek answers this (canonical or built) request in thinking mode, so that tool-call turns in its
    history need their reasoning back. R1-era models reason but refuse reasoning as input: False. `served`: a
    retired name the upstream lists (the seed document's API has no thinking mode): False."""
    if served or is_r1(model):
        return False
    kind = _thinking_type(body, model)
    if kind == "enabled" and body.get("tools") and _forced_tool_choice(body.get("tool_choice")):
        return False
    return kind != "disabled"


def _thinking_type(body: dict[str, Any], model: str) -> str | None:
    """The switch a request asks for: explicit `thinking`, else `reasoning_effort` (`none` = off, a level = on), else
    the retired name's mode; None = DeepSeek's default (enabled)."""
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "disabled"):
        return str(thinking["type"])
    effort = body.get("reasoning_effort")
    if effort == "none":
        return "disabled"
    if isinstance(effort, str) and effort in EFFORTS:
        return "enabled"
    return RETIRED_MODELS.get(model)


class DeepSeekSession(UpstreamSession):
    def build_request(self, body: ChatRequest) -> dict[str, Any]:
        out = super().build_request(body)
        thinking = out.get("thinking")
        self.thinking_off = isinstance(thinking, dict) and thinking.get("type") == "disabled"
        return out


class DeepSeekProbe(Probe):
    def listing(self, listing: ProbeListing) -> str | None:
        return "serves /models without /v1" if listing.plain_listed else None

    def chat_body(self, body: dict[str, Any], tools: bool) -> None:
        if tools:  # thinking mode (DeepSeek's default) refuses a forced tool_choice
            body["thinking"] = {"type": "disabled"}


class DeepSeekDialect(Dialect):
    name = "deepseek"
    session_class = DeepSeekSession
    # Structured output: JSON mode is DeepSeek's own; a json_schema is emulated by a forced tool call, strict (on the
    # /beta route) where the schema fits strict mode's subset (docs/structured-output.md).
    rules = RequestRules(reasoning_source="field", supports_prefix=True, reasoning_fallback=REASONING_PLACEHOLDER,
                         response_format="emulate",
                         structured=StructuredCaps(forced_tool=True, strict_tools=True, json_mode=True))
    prepares = True
    offers_usage_fields = True  # `client.usage_fields: deepseek`: prompt_cache_hit/miss_tokens for chat clients
    probe = DeepSeekProbe()

    @classmethod
    def client_usage_fields(cls) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
        return deepseek_usage_fields

    async def prepare(self, ctx: RequestContext) -> None:
        """A retired name: whether the upstream still lists it decides its translation (read once, then cached)."""
        catalog = self.catalog
        if catalog is not None and ctx.upstream_model in RETIRED_MODELS:
            await catalog.names()

    def served(self, model: str) -> bool:
        """A retired name that the upstream lists: sent unchanged, under the seed document's rules."""
        catalog = self.catalog
        return catalog is not None and model in RETIRED_MODELS and catalog.lists(model)

    def r1(self, model: str) -> bool:
        """R1-era rules for this upstream name: the R1 pattern, or the retired reasoner where it is still served."""
        return is_r1(model) or (model == RETIRED_R1 and self.served(model))

    def routable_models(self, listed: tuple[str, ...]) -> list[str]:
        """The upstream's names, and the retired ones it does not list: they route too, as V4 Flash's two modes."""
        return [*listed, *(name for name in RETIRED_MODELS if name not in listed)]

    def reasoning_replay(self, body: ChatRequest, ctx: RequestContext) -> str:
        """`auto`: `strip` for R1-era models, `restore` in thinking mode, else `keep` (nothing needs to come back)."""
        mode = ctx.upstream.reasoning_replay
        if mode in ("strip", "keep"):
            return mode
        model = ctx.upstream_model
        if mode == "auto" and self.r1(model):
            return "strip"
        return "restore" if thinking_on(body, model, self.served(model)) else "keep"

    # -- requests ---------------------------------------------------------------------------------------------
    def structured_caps(self, body: ChatRequest, ctx: RequestContext) -> StructuredCaps:
        """A thinking mode the client asked for refuses a forced tool (and the proxy would otherwise switch it off
        for the call), as do R1-era reasoners, which call no tools: JSON mode, checked and asked again, instead."""
        model = ctx.upstream_model
        if self.r1(model) or _thinking_type(body, model) == "enabled":
            return StructuredCaps(forced_tool=False, json_mode=True)
        return self.rules.structured

    def build_request(self, body: ChatRequest, ctx: RequestContext) -> dict[str, Any]:
        model = ctx.upstream_model
        out = super().build_request(body, ctx)
        if not ctx.stream:
            out.pop("stream_options", None)  # "只有在 stream 参数为 true 时,才可设置此参数"
        served = self.served(model)
        if ctx.kind != CHAT:
            if model in RETIRED_MODELS and not served:  # FIM on /beta/completions: the retired names' model
                out["model"] = RETIRED_TARGET
            return out
        r1 = self.r1(model)
        _check_n(out)
        _check_response_format(out)
        if r1:
            _refuse_logprobs(out, model)
        if served and not r1:
            # The seed document's `deepseek-chat`: no thinking mode and no effort; a client's own `thinking` goes as
            # sent, the proxy adds none.
            out.pop("reasoning_effort", None)
            thinking = False
        else:
            thinking = _map_thinking(out, model, r1)
        if model in RETIRED_MODELS and not served:
            out["model"] = RETIRED_TARGET
        policy = ctx.upstream.reasoning_replay
        if policy == "auto" and r1:
            policy = "strip"
        messages = [_split_inline_reasoning(_plain(m)) for m in out["messages"]]
        messages = [_replay(m, policy, i == len(messages) - 1, thinking) for i, m in enumerate(messages)]
        if r1:
            messages = merge_successive(messages)
        out["messages"] = messages
        return out

    def request_path(self, path: str, body: dict[str, Any], ctx: RequestContext) -> str:
        """The assistant-prefix continuation, strict function calling and FIM completion are served under /beta
        only."""
        beta = path.startswith(BETA + "/")
        if not beta and ctx.kind == CHAT and (_has_prefix(body) or _has_strict_tool(body)):
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


def _map_thinking(out: dict[str, Any], model: str, r1: bool) -> bool:
    """`thinking` and `reasoning_effort` as DeepSeek takes them; True when the request is in thinking mode."""
    if r1:  # R1 always reasons and has no switch
        out.pop("thinking", None)
        out.pop("reasoning_effort", None)
        return False
    kind = _thinking_type(out, model)
    effort = out.pop("reasoning_effort", None)
    if kind == "enabled" and out.get("tools") and _forced_tool_choice(out.get("tool_choice")):
        # DeepSeek refuses a forced tool_choice in thinking mode; the forced call is what the client needs.
        kind = "disabled"
    elif kind is None and out.get("tools") and _forced_tool_choice(out.get("tool_choice")):
        kind = "disabled"  # thinking is on by default: say so
    if kind is not None:
        thinking = out.get("thinking")
        out["thinking"] = {**(thinking if isinstance(thinking, dict) else {}), "type": kind}
    if kind != "disabled" and isinstance(effort, str) and effort in EFFORTS:
        out["reasoning_effort"] = EFFORTS[effort]
    return kind != "disabled"


def _has_strict_tool(body: dict[str, Any]) -> bool:
    tools = body.get("tools")
    return isinstance(tools, list) and any(
        isinstance(t, dict) and isinstance(t.get("function"), dict) and t["function"].get("strict") is True
        for t in tools)


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
    """Reasoning on one input message, per docs/decisions.md "DeepSeek reasoning replay"."""
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
    keep = (last and message.get("prefix") is True) or policy == "keep" or (policy != "strip" and tool_turn)
    needed = tool_turn and thinking
    if keep and isinstance(reasoning, str) and (reasoning or not needed):
        out["reasoning_content"] = reasoning
    elif keep and needed:
        # proxy/hub/continuity.py restores what it stored; should a turn still lack reasoning here (a `keep` upstream,
        # a client that sent none or an empty one), thinking mode refuses it without: the fixed placeholder.
        out["reasoning_content"] = REASONING_PLACEHOLDER
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
