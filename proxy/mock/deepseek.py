"""Mock DeepSeek API: `POST /chat/completions` (also under `/v1` and `/beta`), `GET /models`, and its Anthropic API
(`POST /anthropic/v1/messages`: anthropic_api.py).

Written from DeepSeek's API as it is today (docs/deepseek.md) and its reference and observed behaviour
(docs/upstreams.md "DeepSeek API"), and strict like the real API:

* Models: `deepseek-flash`, `deepseek-v4-flash`, `deepseek-v4-pro`. The retired `deepseek-chat` and
  `deepseek-reasoner` -> 400 `Model Not Exist`. Any other name is served too (a DeepSeek-compatible host), R1-era
  when it matches the R1 pattern (`deepseek-r1`, `DeepSeek-R1-Distill-…`).
* Flavour `legacy` (`create_app("deepseek", flavour="legacy")`): the API of the seed document
  (docs/upstreams.md "DeepSeek API") — `GET /models` lists `deepseek-chat` and `deepseek-reasoner`; today's V4
  names -> `Model Not Exist`; `deepseek-chat` has no thinking mode, `deepseek-reasoner` is R1 (the R1 rules below);
  `thinking` and `reasoning_effort` are fields that API does not know (ignored).
* Thinking mode is on by default; `thinking: {"type": "enabled" | "disabled"}` switches it, `reasoning_effort`
  grades it (`low` `high` `max`, and `minimal` `medium` `xhigh` `ultra` which DeepSeek maps; anything else -> 422).
  In thinking mode temperature, top_p and the penalties are ignored without error (not even range-checked), a
  forced `tool_choice` -> 400, and an assistant message with `tool_calls` but no (or an empty: the stricter reading
  of reports that differ) `reasoning_content` -> 400 "The `reasoning_content` in the thinking mode must be passed
  back to the API." (reasoning on other assistant messages is accepted and ignored).

* Errors are OpenAI-shaped with DeepSeek's status set: 400 Invalid Format / invalid parameter, 401 Authentication
  Fails, 402 Insufficient Balance, 422 Invalid Parameters (bodies that do not deserialize), 429 Rate Limit Reached
  (with `Retry-After`), 500 Server Error, 503 Server Overloaded.
* `max_tokens` is an integer in [1, 384000] (default 4096); `stop` at most 16 strings; `temperature` [0, 2];
  `top_p` (0, 1]; penalties [-2, 2]; at most 128 tools; `top_logprobs` <= 20 and only with `logprobs: true`;
  `stream_options` only with `stream: true`.
* R1-era models (names matching the R1 pattern): always reasoning, no switch; `reasoning_content` in input
  messages -> 400 (except on a last assistant message with `prefix: true`, the beta continuation), successive
  user/user or assistant/assistant messages -> 400, `logprobs`/`top_logprobs` -> 400.
* A reasoning stream starts with `{"role":"assistant","content":null,"reasoning_content":""}`, then each delta has
  exactly one of `reasoning_content` / `content` non-null.
* `prefix: true` is accepted on the last message, which must be an assistant message, and only on the `/beta` route
  ("您必须设置 base_url=https://api.deepseek.com/beta 来使用此功能").
* Streams: `: keep-alive` comment lines before the first chunk (one by default; directive `keepalive` adds more and
  one after every chunk); every delta repeats `"role":"assistant"`; the last chunk has `"role": null`, the
  `finish_reason` AND the usage (non-empty `choices`, as observed in the wild), whether or not
  `stream_options.include_usage` was sent; with it, the other chunks carry `"usage": null`.
* Usage has `prompt_cache_hit_tokens`, `prompt_cache_miss_tokens`, `prompt_tokens_details.cached_tokens` and, when
  reasoning, `completion_tokens_details.reasoning_tokens` (directive `cache_fields_only`: no `prompt_tokens_details`,
  as in the spec document's usage schema). finish_reason may be `insufficient_system_resource`
  (directive `insufficient_resource`).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

import orjson
from starlette.responses import Response
from starlette.routing import Route

from proxy.mock import anthropic_api
from proxy.mock import scenario as scenarios
from proxy.mock.asgi import JSON_HEADERS, Plan, Stats, body_plan, sse, stream_plan, truncated_json_plan
from proxy.mock.common import (
    Call,
    MockConfig,
    Template,
    bearer_checker,
    inference,
    is_number,
    models_routes,
    openai_error,
    preamble,
    static_response,
    stream_directives,
)
from proxy.mock.openai import Style, completion_json, completion_stream, tool_call_delta
from proxy.mock.textgen import Generation, Piece, generate, prompt_tokens_chat, structured_reply, tool_names

FINGERPRINT = "fp_mock_ds01"
MODELS = ["deepseek-flash", "deepseek-v4-flash", "deepseek-v4-pro"]
RETIRED = ("deepseek-chat", "deepseek-reasoner")
LEGACY = "legacy"
FLAVOURS = {
    LEGACY: "the API of DeepSeek's first chat completion reference: deepseek-chat (no thinking mode) and "
            "deepseek-reasoner (R1); today's V4 names do not exist there",
}
EFFORTS = ("low", "high", "max", "minimal", "medium", "xhigh", "ultra")
R1_MODEL = re.compile(r"(?i)(^|[^a-z0-9])r1([^a-z0-9]|$)")
PASS_BACK = "The `reasoning_content` in the thinking mode must be passed back to the API."
MAX_TOKENS = 384000
DEFAULT_MAX_TOKENS = 4096
KEEPALIVE = b": keep-alive\n\n"
FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

ERRORS: dict[int, tuple[str, str]] = {
    400: ("Invalid Format", "invalid_request_error"),
    401: ("Authentication Fails, Your api key: **** is invalid", "authentication_error"),
    402: ("Insufficient Balance", "unknown_error"),
    422: ("Invalid Parameters", "invalid_request_error"),
    429: ("Rate Limit Reached", "rate_limit_error"),
    500: ("Server Error", "server_error"),
    503: ("Server Overloaded", "server_error"),
}


def error_plan(status: int, message: str | None = None) -> Plan:
    default, type_ = ERRORS.get(status, (f"Error {status}", "server_error" if status >= 500
                                         else "invalid_request_error"))
    headers = [(b"retry-after", b"7")] if status == 429 else None
    return openai_error(status, message or default, type_, "invalid_request_error", headers=headers)


def _bad(message: str) -> Plan:
    return error_plan(400, message)


def _deserialize(message: str) -> Plan:
    return error_plan(422, f"Failed to deserialize the JSON body into the target type: {message}")


def is_r1(model: str, legacy: bool = False) -> bool:
    """R1-era by name; in the legacy flavour `deepseek-reasoner` is R1 too (the seed document's reasoner)."""
    return bool(R1_MODEL.search(model)) or (legacy and model == "deepseek-reasoner")


def thinking_enabled(body: dict[str, Any], legacy: bool = False) -> bool:
    """Thinking mode: on by default for every model but R1-era ones (which always reason, with R1's rules). The
    legacy API has no thinking mode (and no `thinking` parameter: ignored, like any field it does not know)."""
    if legacy or is_r1(str(body.get("model"))):
        return False
    thinking = body.get("thinking")
    return not (isinstance(thinking, dict) and thinking.get("type") == "disabled")


# ------------------------------------------------------------------------------------------------- validation

def validate(body: Any, served: str | None, legacy: bool = False) -> Plan | None:
    if not isinstance(body, dict):
        return _deserialize("invalid type: expected struct ChatCompletionRequest")
    if "messages" not in body:
        return _deserialize("missing field `messages`")
    if "model" not in body:
        return _deserialize("missing field `model`")
    model, messages = body["model"], body["messages"]
    if not isinstance(model, str):
        return _deserialize("model: invalid type, expected a string")
    if not isinstance(messages, list):
        return _deserialize("messages: invalid type, expected a sequence")
    if (served is not None and model != served) or (served is None and model in (MODELS if legacy else RETIRED)):
        return _bad("Model Not Exist")
    if not messages:
        return _bad("Invalid messages: the messages list must not be empty")
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("system", "user", "assistant", "tool"):
            return _deserialize(f"messages[{i}]: unknown variant `{role}`, expected one of `system`, `user`, "
                                "`assistant`, `tool`")
        if message.get("prefix") is True and (role != "assistant" or i != len(messages) - 1):
            return _bad(f"Invalid messages[{i}]: `prefix` is only allowed on the last message, an assistant "
                        "message")
    thinking = thinking_enabled(body, legacy)
    if (plan := _validate_params(body, thinking, legacy)) is not None:
        return plan
    if is_r1(model, legacy):
        if body.get("logprobs") or body.get("top_logprobs") is not None:
            return _bad(f"{model} does not support logprobs or top_logprobs")
        last = len(messages) - 1
        for i, message in enumerate(messages):
            if "reasoning_content" in message and not (i == last and message.get("prefix") is True):
                return _bad(f"The reasoning_content of messages[{i}] is not supported as input by "
                            f"{model}; remove it (it is only accepted on a last assistant message with "
                            "prefix: true)")
        for i in range(1, len(messages)):
            prev, cur = messages[i - 1]["role"], messages[i]["role"]
            if prev == cur and cur in ("user", "assistant"):
                return _bad(f"{model} does not support successive user or assistant messages "
                            f"(messages[{i - 1}] and messages[{i}] in your input). You should interleave the "
                            "user/assistant messages in the message sequence.")
    if thinking:
        choice = body.get("tool_choice")
        if choice == "required" or isinstance(choice, dict):
            return _bad("Thinking mode does not support a forced tool_choice (`required` or a named function); "
                        "use `auto` or `none`, or disable thinking")
        for message in messages:
            # The stricter reading of reports that differ: an empty `reasoning_content` does not count as passed
            # back (docs/deepseek.md "Reasoning continuity").
            if message["role"] == "assistant" and message.get("tool_calls") and \
                    not (isinstance(message.get("reasoning_content"), str) and message["reasoning_content"]):
                return _bad(PASS_BACK)
    return None


def _validate_params(body: dict[str, Any], thinking: bool, legacy: bool = False) -> Plan | None:
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                   or not 1 <= max_tokens <= MAX_TOKENS):
        return _bad(f"Invalid max_tokens value, the valid range of max_tokens is [1, {MAX_TOKENS}]")
    for key, lo, hi, lo_open in (("temperature", 0.0, 2.0, False), ("top_p", 0.0, 1.0, True),
                                 ("frequency_penalty", -2.0, 2.0, False), ("presence_penalty", -2.0, 2.0, False)):
        value = body.get(key)
        if value is None or thinking:  # thinking mode ignores them, without error
            continue
        if not is_number(value) or value > hi or value < lo or (lo_open and value <= lo):
            return _bad(f"Invalid {key} value, the valid range of {key} is "
                        f"{'(' if lo_open else '['}{lo:g}, {hi:g}]")
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, list):
            if len(stop) > 16 or not all(isinstance(s, str) for s in stop):
                return _bad("Invalid stop value: at most 16 stop sequences (strings) are allowed")
        elif not isinstance(stop, str):
            return _deserialize("stop: invalid type, expected a string or a sequence of strings")
    if "stream" in body and body["stream"] is not None and not isinstance(body["stream"], bool):
        return _deserialize("stream: invalid type, expected a boolean")
    if body.get("stream_options") is not None and body.get("stream") is not True:
        return _bad("stream_options should be set along with stream = true")
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            return _deserialize("tools: invalid type, expected a sequence")
        if len(tools) > 128:
            return _bad("Invalid tools: at most 128 functions are supported")
        for i, tool in enumerate(tools):
            fn = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
                return _deserialize(f"tools[{i}]: expected {{\"type\": \"function\", \"function\": {{...}}}}")
            if not isinstance(fn.get("name"), str) or not FUNCTION_NAME.match(fn["name"]):
                return _bad(f"Invalid tools[{i}].function.name: must be a-z, A-Z, 0-9, underscores and dashes, "
                            "at most 64 characters")
    choice = body.get("tool_choice")
    if choice is not None and not (choice in ("none", "auto", "required") or
                                   isinstance(choice, dict) and choice.get("type") == "function"):
        return _deserialize("tool_choice: unknown variant, expected `none`, `auto`, `required` or a named tool")
    logprobs, top = body.get("logprobs"), body.get("top_logprobs")
    if top is not None:
        if not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= 20:
            return _bad("Invalid top_logprobs value, the valid range of top_logprobs is [0, 20]")
        if logprobs is not True:
            return _bad("logprobs must be true when top_logprobs is set")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object")):
        return _bad("Invalid response_format type, must be one of `text` or `json_object`")
    if legacy:  # the seed document has neither `thinking` nor `reasoning_effort`: unknown fields, ignored
        return None
    switch = body.get("thinking")
    if switch is not None and (not isinstance(switch, dict) or switch.get("type") not in ("enabled", "disabled")):
        return _deserialize("thinking.type: unknown variant, expected `enabled` or `disabled`")
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in EFFORTS:
        return _deserialize(f"reasoning_effort: unknown variant `{effort}`, expected one of `low`, `high`, `max`")
    return None


# -------------------------------------------------------------------------------------------------- responses

def _usage(prompt: int, gen: Generation, reasoning_mode: bool, flat: bool = False) -> dict[str, Any]:
    hit = (prompt // 2) // 64 * 64
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": gen.completion_tokens,
        "total_tokens": prompt + gen.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": hit},
        "prompt_cache_hit_tokens": hit,
        "prompt_cache_miss_tokens": prompt - hit,
    }
    if flat:  # directive `cache_fields_only`: the usage object as the spec document draws it
        del usage["prompt_tokens_details"]
    if reasoning_mode:
        usage["completion_tokens_details"] = {"reasoning_tokens": gen.reasoning_tokens}
    return usage


def _generation(call: Call, reasoning_mode: bool) -> Generation:
    sc = call.scenario
    body = call.body
    max_tokens = body.get("max_tokens") or DEFAULT_MAX_TOKENS
    cut = "insufficient_system_resource" if sc.has("insufficient_resource") else None
    return generate(sc, dialect="deepseek", max_tokens=max_tokens, reasoning_field=reasoning_mode,
                    tools=tool_names(body), cut_reason=cut, reply=structured_reply(body, ("json_object",), sc))


def chat_stream(call: Call, model: str, reasoning_mode: bool) -> Plan:
    sc = call.scenario
    gen = _generation(call, reasoning_mode)
    usage_on = call.include_usage
    ident = uuid.uuid4().hex
    noindex = sc.has("tool_calls_noindex")

    def chunk(delta: dict[str, Any], finish: str | None = None, usage: Any = ...) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "choices": [{"delta": delta, "finish_reason": finish, "index": 0, "logprobs": None}],
            "created": call.created, "id": ident, "model": model, "object": "chat.completion.chunk",
            "system_fingerprint": FINGERPRINT,
        }
        if usage is not ...:
            obj["usage"] = usage
        elif usage_on:
            obj["usage"] = None
        return obj

    if reasoning_mode:
        first = {"role": "assistant", "content": None, "reasoning_content": ""}
        content_tpl = Template(chunk({"content": Template.SLOT, "reasoning_content": None, "role": "assistant"}))
        reasoning_tpl = Template(chunk({"content": None, "reasoning_content": Template.SLOT, "role": "assistant"}))
    else:
        first = {"content": "", "role": "assistant"}
        content_tpl = Template(chunk({"content": Template.SLOT, "role": "assistant"}))
        reasoning_tpl = Template(chunk({"content": None, "reasoning_content": Template.SLOT, "role": "assistant"}))
    keepalive = sc.has("keepalive")
    head = [KEEPALIVE] * (3 if keepalive else 1) + [sse(chunk(first, usage=None))]
    body: list[bytes] = []
    for piece in gen.pieces:
        if piece.kind == "content":
            body.append(content_tpl.frame(piece.text))
        elif piece.kind == "reasoning":
            body.append(reasoning_tpl.frame(piece.text))
        else:
            body.append(sse(chunk(_tool_delta(piece, noindex, reasoning_mode))))
    tail: list[bytes] = []
    if not sc.has("no_finish"):
        last: dict[str, Any] = {"content": "", "role": None}
        if reasoning_mode:
            last["reasoning_content"] = None
        usage = _usage(prompt_tokens_chat(call.body["messages"]), gen, reasoning_mode, sc.has("cache_fields_only"))
        tail.append(sse(chunk(last, gen.finish_reason, usage)))
    tail.append(b"data: [DONE]\n\n")
    return stream_plan(head, body, tail, between=KEEPALIVE if keepalive else None, **stream_directives(sc))


def _tool_delta(piece: Piece, noindex: bool, reasoning_mode: bool) -> dict[str, Any]:
    call = tool_call_delta(piece, noindex)
    delta: dict[str, Any] = {"content": None}
    if reasoning_mode:
        delta["reasoning_content"] = None
    delta["role"] = "assistant"
    delta["tool_calls"] = [call]
    return delta


def chat_json(call: Call, model: str, reasoning_mode: bool) -> Plan:
    sc = call.scenario
    gen = _generation(call, reasoning_mode)
    message: dict[str, Any] = {"role": "assistant", "content": gen.content}
    if reasoning_mode:
        message["reasoning_content"] = gen.reasoning
    if gen.tool_calls:
        message["tool_calls"] = gen.tool_calls
    obj = {
        "id": str(uuid.uuid4()), "object": "chat.completion", "created": call.created, "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": gen.finish_reason}],
        "usage": _usage(prompt_tokens_chat(call.body["messages"]), gen, reasoning_mode, sc.has("cache_fields_only")),
        "system_fingerprint": FINGERPRINT,
    }
    data = orjson.dumps(obj)
    if sc.has("drop"):
        return truncated_json_plan(data)
    if sc.has("keepalive"):
        data = b"\n\n\n" + data  # the blank lines DeepSeek sends while a non-stream request waits
    return body_plan(200, data, JSON_HEADERS)


# ----------------------------------------------------------------------------------------------------- routes

def _handle(call: Call) -> Plan:
    if (plan := preamble(call, error_plan)) is not None:
        return plan
    if not call.json_ok:
        return _bad("Failed to parse the request body as JSON")
    legacy = call.cfg.flavour == LEGACY
    if (plan := validate(call.body, call.cfg.served_model, legacy)) is not None:
        return plan
    if not call.path.startswith("/beta/") and any(
            isinstance(m, dict) and m.get("prefix") is True for m in call.body["messages"]):
        return _bad("The chat prefix completion (`prefix: true`) is a beta feature: set base_url to "
                    "https://api.deepseek.com/beta to use it")
    model = call.body["model"]
    reasoning_mode = is_r1(model, legacy) or thinking_enabled(call.body, legacy)
    return (chat_stream if call.stream else chat_json)(call, model, reasoning_mode)


FIM_STYLE = Style(name="deepseek", fingerprint=FINGERPRINT, refusal=False, default_model=MODELS[0],
                  completion_default_max_tokens=None)
FIM_MAX_TOKENS = 4096  # "FIM 补全的 max_tokens 最大为 4K"


def _handle_fim(call: Call) -> Plan:
    """`POST /beta/completions`: FIM (fill in the middle) completion in OpenAI's text_completion shape (`prompt`,
    optional `suffix`, `max_tokens` <= 4K, `echo`, `logprobs`, `stream`). No thinking; retired names are refused as
    on the chat route, R1-era models do not complete."""
    if (plan := preamble(call, error_plan)) is not None:
        return plan
    body = call.body
    if not call.json_ok or not isinstance(body, dict):
        return _bad("Failed to parse the request body as JSON")
    model = body.get("model")
    served = call.cfg.served_model
    legacy = call.cfg.flavour == LEGACY
    unknown = MODELS if legacy else RETIRED
    if not isinstance(model, str) or (served and model != served) or (not served and model in unknown):
        return _bad("Model Not Exist")
    if is_r1(model, legacy):
        return _bad(f"{model} does not support FIM completion; use {'deepseek-chat' if legacy else MODELS[0]}")
    if not isinstance(body.get("prompt"), str):
        return _bad("Missing or invalid `prompt`: FIM completion takes one prompt string")
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or not 1 <= max_tokens <= FIM_MAX_TOKENS):
        return _bad(f"Invalid max_tokens value, the valid range of max_tokens is [1, {FIM_MAX_TOKENS}]")
    return (completion_stream if call.stream else completion_json)(call, FIM_STYLE, model)


def routes(cfg: MockConfig, stats: Stats) -> list[Route]:
    endpoint = inference(cfg, stats, _handle)

    def denied() -> Response:
        return static_response(error_plan(401))

    names = [cfg.served_model] if cfg.served_model else list(RETIRED) if cfg.flavour == LEGACY else MODELS
    check: Callable[..., Response | None] = bearer_checker(cfg, denied)
    return [
        Route("/chat/completions", endpoint, methods=["POST"]),
        Route("/v1/chat/completions", endpoint, methods=["POST"]),
        Route("/beta/chat/completions", endpoint, methods=["POST"]),
        Route("/beta/completions", inference(cfg, stats, _handle_fim, scenarios.from_prompt), methods=["POST"]),
        *models_routes(stats, names, "deepseek", paths=("/models", "/v1/models"), check_auth=check),
        *anthropic_api.api_routes(cfg, stats, "/anthropic/v1/messages", _anthropic_model),
    ]


def _anthropic_model(model: str) -> str | None:
    """DeepSeek's Anthropic API: `claude…` names map to its models, its own and other hosts' names are served as on
    the chat route; the retired names are a 400."""
    return "Model Not Exist" if model in RETIRED else None
