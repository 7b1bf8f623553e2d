"""Mock plain OpenAI API: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, and the Responses
API (`POST /v1/responses`, `/v1/responses/compact`: responses_api.py).

The reference shape every other dialect is translated to:
* stream: first delta `{"role":"assistant","content":"","refusal":null}`, then deltas carrying only the new
  `content` (or `reasoning_content`, or `tool_calls` with `index`), a last chunk per choice with an empty delta and
  `finish_reason`, then `data: [DONE]`. With `stream_options.include_usage` every chunk carries `"usage": null` and
  an extra last chunk has `"choices": []` and the usage.
* errors: `{"error": {"message", "type", "param", "code"}}`.
* directive `extra_fields`: an unknown field `"x_vendor": {"a": 1}` at the top level of every response and chunk,
  in every choice, in every delta/message and in usage (to check a relay passes unknown fields through).

The builders here are shared with the "engine" dialect (engine.py) through `Style`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.responses import Response
from starlette.routing import Route

from proxy.mock import responses_api, retrieval
from proxy.mock import scenario as scenarios
from proxy.mock.asgi import DONE, Plan, Stats, body_plan, sse, stream_plan, truncated_json_plan
from proxy.mock.common import (
    Call,
    MockConfig,
    Template,
    bearer_checker,
    inference,
    int_param,
    is_number,
    models_routes,
    openai_error,
    preamble,
    static_response,
    stream_directives,
)
from proxy.mock.scenario import Scenario
from proxy.mock.textgen import (
    Generation,
    Piece,
    generate,
    prompt_tokens_chat,
    prompt_tokens_text,
    structured_reply,
    tool_names,
)

EXTRA = {"x_vendor": {"a": 1}}

ERRORS: dict[int, tuple[str, str, str | None]] = {
    400: ("Invalid request (mock directive error=400)", "invalid_request_error", None),
    401: ("Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
    403: ("You are not allowed to access this resource.", "permission_error", None),
    404: ("The model does not exist or you do not have access to it.", "invalid_request_error", "model_not_found"),
    409: ("Conflict (mock directive error=409)", "invalid_request_error", None),
    422: ("Unprocessable request (mock directive error=422)", "invalid_request_error", None),
    429: ("Rate limit reached for requests", "requests", "rate_limit_exceeded"),
    500: ("The server had an error while processing your request. Sorry about that!", "server_error", None),
    502: ("Bad gateway.", "server_error", None),
    503: ("The engine is currently overloaded, please try again later.", "server_error", None),
}


def error_plan(status: int) -> Plan:
    message, type_, code = ERRORS.get(status, (f"Mock error {status}", "server_error" if status >= 500
                                               else "invalid_request_error", None))
    headers = [(b"retry-after", b"7")] if status == 429 else None
    return openai_error(status, message, type_, code, headers=headers)


@dataclass(frozen=True)
class Style:
    """How an OpenAI-like server words its responses."""

    name: str = "openai"
    fingerprint: str | None = "fp_mock0001"
    refusal: bool = True  # `refusal: null` in the first delta and in messages
    default_model: str = "mock-gpt"
    completion_default_max_tokens: int | None = None
    response_formats: tuple[str, ...] = ("text", "json_object", "json_schema")  # the ones the server honours


def _ident(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def _usage(prompt: int, gens: list[Generation], extra: bool) -> dict[str, Any]:
    completion = sum(g.completion_tokens for g in gens)
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                             "total_tokens": prompt + completion}
    reasoning = sum(g.reasoning_tokens for g in gens)
    if reasoning:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    if extra:
        usage.update(EXTRA)
    return usage


def _tool_delta(piece: Piece, noindex: bool) -> dict[str, Any]:
    return {"tool_calls": [tool_call_delta(piece, noindex)]}


def tool_call_delta(piece: Piece, noindex: bool) -> dict[str, Any]:
    """One streamed tool-call fragment: the call's head (index, id, type, name) or an arguments piece."""
    info = piece.tool or {}
    if "id" in info:
        call: dict[str, Any] = {"index": info["index"], "id": info["id"], "type": "function",
                                "function": {"name": info["name"], "arguments": ""}}
    else:
        call = {"index": info["index"], "function": {"arguments": info["arguments"]}}
    if noindex:
        del call["index"]
    return call


def _interleave(per_choice: list[list[bytes]]) -> list[bytes]:
    out: list[bytes] = []
    for step in range(max((len(f) for f in per_choice), default=0)):
        out += [frames[step] for frames in per_choice if step < len(frames)]
    return out



def _n(call: Call) -> int:
    directive = call.scenario.num("n", None, lo=1, hi=16)
    if directive is not None:
        return directive
    return max(1, min(16, int_param(call.body, "n") or 1))


def generations(call: Call, style: Style, *, text: bool = False, max_default: int | None = None) -> list[Generation]:
    sc = call.scenario
    if text:
        sc = scenarios.Scenario({k: v for k, v in sc.flags.items()
                                 if k not in ("reasoning_field", "tool_calls", "tool_calls_noindex")})
    else:
        sc = scenarios.r1_thinking(call.body, sc)
    max_tokens = int_param(call.body, "max_tokens") or int_param(call.body, "max_completion_tokens") or max_default
    names = tool_names(call.body)
    reply = None if text else structured_reply(call.body, style.response_formats, sc)
    return [generate(sc, dialect=style.name, max_tokens=max_tokens, tools=names, reply=reply)
            for _ in range(_n(call))]


def chat_stream(call: Call, style: Style, model: str) -> Plan:
    sc = call.scenario
    extra = sc.has("extra_fields")
    usage_on = call.include_usage
    noindex = sc.has("tool_calls_noindex")
    gens = generations(call, style)
    base: dict[str, Any] = {"id": _ident("chatcmpl-"), "object": "chat.completion.chunk", "created": call.created,
                            "model": model}
    if style.fingerprint:
        base["system_fingerprint"] = style.fingerprint
    if extra:
        base.update(EXTRA)

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        if extra:
            delta = {**delta, **EXTRA}
        choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        if extra:
            choice.update(EXTRA)
        obj = {**base, "choices": [choice]}
        if usage_on:
            obj["usage"] = None
        return obj

    first: dict[str, Any] = {"role": "assistant", "content": ""}
    if style.refusal:
        first["refusal"] = None
    head = [sse(chunk(i, first)) for i in range(len(gens))]
    per_choice: list[list[bytes]] = []
    for i, gen in enumerate(gens):
        content_tpl = Template(chunk(i, {"content": Template.SLOT}))
        frames = []
        for piece in gen.pieces:
            if piece.kind == "content":
                frames.append(content_tpl.frame(piece.text))
            elif piece.kind == "reasoning":
                frames.append(sse(chunk(i, {"reasoning_content": piece.text})))
            else:
                frames.append(sse(chunk(i, _tool_delta(piece, noindex))))
        per_choice.append(frames)
    body = _interleave(per_choice)
    tail: list[bytes] = []
    if not sc.has("no_finish"):
        tail += [sse(chunk(i, {}, gen.finish_reason)) for i, gen in enumerate(gens)]
    if usage_on:
        tail.append(sse({**base, "choices": [], "usage": _usage(prompt_tokens_chat(call.body.get("messages")),
                                                                 gens, extra)}))
    tail.append(DONE)
    return stream_plan(head, body, tail, **stream_directives(sc))


def chat_json(call: Call, style: Style, model: str) -> Plan:
    sc = call.scenario
    extra = sc.has("extra_fields")
    gens = generations(call, style)
    choices = []
    for i, gen in enumerate(gens):
        message: dict[str, Any] = {"role": "assistant", "content": None if gen.tool_calls else gen.content}
        if gen.reasoning_tokens:
            message["reasoning_content"] = gen.reasoning
        if gen.tool_calls:
            message["tool_calls"] = gen.tool_calls
        if style.refusal:
            message["refusal"] = None
        if extra:
            message.update(EXTRA)
        choice: dict[str, Any] = {"index": i, "message": message, "logprobs": None,
                                  "finish_reason": gen.finish_reason}
        if extra:
            choice.update(EXTRA)
        choices.append(choice)
    obj: dict[str, Any] = {"id": _ident("chatcmpl-"), "object": "chat.completion", "created": call.created,
                           "model": model, "choices": choices,
                           "usage": _usage(prompt_tokens_chat(call.body.get("messages")), gens, extra)}
    if style.fingerprint:
        obj["system_fingerprint"] = style.fingerprint
    if extra:
        obj.update(EXTRA)
    return json_body(obj, sc)


def json_body(obj: dict[str, Any], sc: Scenario) -> Plan:
    data = orjson.dumps(obj)
    return truncated_json_plan(data) if sc.has("drop") else body_plan(200, data)


def completion_stream(call: Call, style: Style, model: str) -> Plan:
    sc = call.scenario
    extra = sc.has("extra_fields")
    usage_on = call.include_usage
    gens = generations(call, style, text=True, max_default=style.completion_default_max_tokens)
    base: dict[str, Any] = {"id": _ident("cmpl-"), "object": "text_completion", "created": call.created,
                            "model": model}
    if style.fingerprint:
        base["system_fingerprint"] = style.fingerprint
    if extra:
        base.update(EXTRA)

    def chunk(index: int, text: Any, finish: str | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"text": text, "index": index, "logprobs": None, "finish_reason": finish}
        if extra:
            choice.update(EXTRA)
        obj = {**base, "choices": [choice]}
        if usage_on:
            obj["usage"] = None
        return obj

    echo = call.body.get("echo") is True
    prompt = call.body.get("prompt")
    head = [sse(chunk(i, prompt)) for i in range(len(gens))] if echo and isinstance(prompt, str) else []
    per_choice = []
    for i, gen in enumerate(gens):
        tpl = Template(chunk(i, Template.SLOT))
        per_choice.append([tpl.frame(p.text) for p in gen.pieces])
    tail: list[bytes] = []
    if not sc.has("no_finish"):
        tail += [sse(chunk(i, "", gen.finish_reason)) for i, gen in enumerate(gens)]
    if usage_on:
        tail.append(sse({**base, "choices": [], "usage": _usage(prompt_tokens_text(prompt), gens, extra)}))
    tail.append(DONE)
    return stream_plan(head, _interleave(per_choice), tail, **stream_directives(sc))


def completion_json(call: Call, style: Style, model: str) -> Plan:
    sc = call.scenario
    extra = sc.has("extra_fields")
    gens = generations(call, style, text=True, max_default=style.completion_default_max_tokens)
    prompt = call.body.get("prompt")
    echo = call.body.get("echo") is True and isinstance(prompt, str)
    choices = []
    for i, gen in enumerate(gens):
        choice: dict[str, Any] = {"text": (prompt if echo else "") + gen.content, "index": i, "logprobs": None,
                                  "finish_reason": gen.finish_reason}
        if extra:
            choice.update(EXTRA)
        choices.append(choice)
    obj: dict[str, Any] = {"id": _ident("cmpl-"), "object": "text_completion", "created": call.created,
                           "model": model, "choices": choices,
                           "usage": _usage(prompt_tokens_text(prompt), gens, extra)}
    if style.fingerprint:
        obj["system_fingerprint"] = style.fingerprint
    if extra:
        obj.update(EXTRA)
    return json_body(obj, sc)


# ------------------------------------------------------------------------------------------------- validation

def _bad(message: str, param: str | None = None, code: str | None = "invalid_value") -> Plan:
    return openai_error(400, message, "invalid_request_error", code, param)


def _validate_common(body: dict[str, Any]) -> Plan | None:
    if "stream" in body and body["stream"] is not None and not isinstance(body["stream"], bool):
        return _bad(f"Invalid type for 'stream': expected a boolean, but got {type(body['stream']).__name__}.",
                    "stream", "invalid_type")
    if body.get("stream_options") is not None and body.get("stream") is not True:
        return _bad("The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options")
    temperature = body.get("temperature")
    if temperature is not None and (not is_number(temperature) or not 0 <= temperature <= 2):
        return _bad(f"Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got "
                    f"{temperature} instead.", "temperature", "decimal_above_max_value")
    for key in ("max_tokens", "max_completion_tokens", "n"):
        value = body.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            return _bad(f"Invalid '{key}': integer below minimum value. Expected a value >= 1, but got {value} "
                        "instead.", key, "integer_below_min_value")
    return None


def validate_chat(body: Any) -> Plan | None:
    if not isinstance(body, dict):
        return _bad("Invalid request body: expected a JSON object.", None, None)
    if not isinstance(body.get("model"), str):
        return _bad("you must provide a model parameter", "model", None)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return _bad("Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty "
                    "array instead.", "messages", "empty_array")
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("system", "developer", "user", "assistant", "tool", "function"):
            return _bad(f"Invalid value: '{role}'. Supported values are: 'system', 'assistant', 'user', "
                        "'function', 'tool', and 'developer'.", f"messages[{i}].role")
    return _validate_common(body)


def validate_completion(body: Any) -> Plan | None:
    if not isinstance(body, dict):
        return _bad("Invalid request body: expected a JSON object.", None, None)
    if not isinstance(body.get("model"), str):
        return _bad("you must provide a model parameter", "model", None)
    if "prompt" not in body:
        return _bad("Missing required parameter: 'prompt'.", "prompt", "missing_required_parameter")
    return _validate_common(body)


# ----------------------------------------------------------------------------------------------------- routes

STYLE = Style()


def _handler(chat: bool) -> Callable[[Call], Plan]:
    def handle(call: Call) -> Plan:
        cfg = call.cfg
        if (plan := preamble(call, error_plan)) is not None:
            return plan
        if not call.json_ok:
            return _bad("We could not parse the JSON body of your request. (HINT: This likely means you aren't "
                        "using your HTTP library correctly.)", None, None)
        if (plan := (validate_chat if chat else validate_completion)(call.body)) is not None:
            return plan
        model = call.body["model"]
        if cfg.served_model is not None and model != cfg.served_model:
            return openai_error(404, f"The model `{model}` does not exist or you do not have access to it.",
                                "invalid_request_error", "model_not_found")
        if chat:
            return (chat_stream if call.stream else chat_json)(call, STYLE, model)
        return (completion_stream if call.stream else completion_json)(call, STYLE, model)

    return handle


def routes(cfg: MockConfig, stats: Stats) -> list[Route]:
    def denied() -> Response:
        return static_response(error_plan(401))

    return [
        Route("/v1/chat/completions", inference(cfg, stats, _handler(True)), methods=["POST"]),
        Route("/v1/completions", inference(cfg, stats, _handler(False), scenarios.from_prompt), methods=["POST"]),
        *responses_api.api_routes(cfg, stats, error_plan),
        *models_routes(stats, [cfg.served_model or STYLE.default_model], "mock",
                       check_auth=bearer_checker(cfg, denied)),
        *retrieval.openai_routes(cfg.served_model or STYLE.default_model, bearer_checker(cfg, denied)),
    ]

