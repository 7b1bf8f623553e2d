"""Mock "engine": the unidentified inference engine of docs/upstreams.md "The engine API" (the whole truth).

Implemented from that document:
* Endpoints `POST /chat` and `POST /completion` (no `/v1` prefix). No model listing (`/v1/models` is 404); only
  the mock's own `GET /health`. A path it does not serve is a 404 in its (OpenAI-shaped) error envelope, as such a
  server answers every OpenAI path (issue 37: a probe must not take that shape for the OpenAI dialect).
* `model` is struck through as "[won't support]": a request that contains `model` is rejected (400). So are the
  other struck-through fields, `user` and (chat) `response_format`. The document says nothing about errors, so
  errors are OpenAI-shaped: `{"error": {"message", "type", "param", "code"}}`.
* Sampling: `temperature` (also accepted under the document's typo `ww`) in [0, 2], `top_p` in [0, 1],
  `do_sample` (bool, default false), `frequency_penalty`/`presence_penalty` in [-2, 2], `seed` accepted (documented
  as having no effect), `logit_bias` values in [-100, 100].
* `stop`: a string or at most 4 strings. `n` >= 1. `max_tokens` >= 1; for /completion it defaults to 16.
* /chat: `messages` of roles system, user, assistant (content string or null, optional `tool_calls`), tool
  (`tool_call_id`); `tools` (at most 128, names a-z A-Z 0-9 _ -, max 64), `tool_choice` none|auto|required|named,
  `parallel_tool_calls`; `logprobs` bool and `top_logprobs` in [0, 20].
* /completion: `prompt` (string or array), `echo`, `logprobs` an integer <= 5, `best_of` >= n and not with
  `stream` ("Results cannot be streamed").
* Responses: the chat completion object (`object: chat.completion`, choices with `message`, `logprobs`,
  `finish_reason` stop|length|tool_calls, `usage`); chat stream chunks (`chat.completion.chunk`, same id and
  `created` in every chunk, deltas with `content`, `role`, `tool_calls` with `index`); the completion object
  (`object: text_completion`) whose streamed chunks have the same shape as the non-streamed response. With
  `stream_options.include_usage`, every chunk has `usage: null` and an extra last chunk has `choices: []` and the
  usage; without it there is no `usage` key in chunks. Streams end with `data: [DONE]`.
* `system_fingerprint` is "[TBD]" in the document: not sent.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from proxy.mock import scenario as scenarios
from proxy.mock.asgi import Plan, Stats
from proxy.mock.common import (
    Call,
    MockConfig,
    inference,
    is_number,
    openai_error,
    preamble,
)
from proxy.mock.openai import Style, chat_json, chat_stream, completion_json, completion_stream, error_plan

STYLE = Style(name="engine", fingerprint=None, refusal=False, default_model="engine", response_formats=(),
              completion_default_max_tokens=16)
FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
UNSUPPORTED_CHAT = ("model", "user", "response_format")
UNSUPPORTED_COMPLETION = ("model", "user")


def _bad(message: str, param: str | None = None, code: str | None = "invalid_value") -> Plan:
    return openai_error(400, message, "invalid_request_error", code, param)


def _number(body: dict[str, Any], key: str, lo: float, hi: float) -> Plan | None:
    value = body.get(key)
    if value is None:
        return None
    if not is_number(value) or not lo <= value <= hi:
        return _bad(f"'{key}' must be a number between {lo:g} and {hi:g}, got {value!r}", key)
    return None


def _positive_int(body: dict[str, Any], key: str) -> Plan | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        return _bad(f"'{key}' must be an integer >= 1, got {value!r}", key)
    return None


def _common(body: dict[str, Any], unsupported: tuple[str, ...]) -> Plan | None:
    for key in unsupported:
        if key in body:
            return _bad(f"Unsupported parameter: '{key}' is not supported by this engine.", key,
                        "unsupported_parameter")
    for key in ("stream", "do_sample", "echo", "parallel_tool_calls"):
        if body.get(key) is not None and not isinstance(body[key], bool):
            return _bad(f"'{key}' must be a boolean", key, "invalid_type")
    if body.get("stream_options") is not None and body.get("stream") is not True:
        return _bad("'stream_options' is only allowed when 'stream' is true", "stream_options")
    for plan in (_number(body, "temperature", 0, 2), _number(body, "ww", 0, 2), _number(body, "top_p", 0, 1),
                 _number(body, "frequency_penalty", -2, 2), _number(body, "presence_penalty", -2, 2),
                 _positive_int(body, "max_tokens"), _positive_int(body, "n")):
        if plan is not None:
            return plan
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str):
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            return _bad("'stop' must be a string or an array of strings", "stop", "invalid_type")
        if len(stop) > 4:
            return _bad(f"'stop' allows up to 4 sequences, got {len(stop)}", "stop")
    bias = body.get("logit_bias")
    if bias is not None and (not isinstance(bias, dict) or
                             not all(is_number(v) and -100 <= v <= 100 for v in bias.values())):
        return _bad("'logit_bias' must map token ids to values between -100 and 100", "logit_bias")
    return None


def validate_chat(body: Any) -> Plan | None:
    if not isinstance(body, dict):
        return _bad("Request body must be a JSON object", None, "invalid_json")
    if (plan := _common(body, UNSUPPORTED_CHAT)) is not None:
        return plan
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return _bad("'messages' must be a non-empty array", "messages")
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("system", "user", "assistant", "tool"):
            return _bad(f"messages[{i}].role must be one of system, user, assistant, tool, got {role!r}",
                        f"messages[{i}].role")
        content = message.get("content")
        if role == "assistant":
            if content is not None and not isinstance(content, str):
                return _bad(f"messages[{i}].content must be a string or null", f"messages[{i}].content")
            if content is None and not message.get("tool_calls"):
                return _bad(f"messages[{i}] needs content or tool_calls", f"messages[{i}].content")
        elif role == "user":
            if not isinstance(content, (str, list)):
                return _bad(f"messages[{i}].content must be a string or an array", f"messages[{i}].content")
        elif not isinstance(content, str):
            return _bad(f"messages[{i}].content must be a string", f"messages[{i}].content")
        if role == "tool" and not isinstance(message.get("tool_call_id"), str):
            return _bad(f"messages[{i}].tool_call_id is required for tool messages", f"messages[{i}].tool_call_id")
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or len(tools) > 128:
            return _bad("'tools' must be an array of at most 128 tools", "tools")
        for i, tool in enumerate(tools):
            fn = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict) or \
                    not isinstance(fn.get("name"), str) or not FUNCTION_NAME.match(fn["name"]):
                return _bad(f"tools[{i}] must be a function with a name of a-z, A-Z, 0-9, underscores and dashes "
                            "(max 64)", f"tools[{i}]")
    choice = body.get("tool_choice")
    if choice is not None and choice not in ("none", "auto", "required") and not (
            isinstance(choice, dict) and choice.get("type") == "function" and
            isinstance(choice.get("function"), dict) and isinstance(choice["function"].get("name"), str)):
        return _bad("'tool_choice' must be none, auto, required or a named function", "tool_choice")
    if body.get("logprobs") is not None and not isinstance(body["logprobs"], bool):
        return _bad("'logprobs' must be a boolean", "logprobs", "invalid_type")
    top = body.get("top_logprobs")
    if top is not None and (not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= 20):
        return _bad("'top_logprobs' must be an integer between 0 and 20", "top_logprobs")
    return None


def validate_completion(body: Any) -> Plan | None:
    if not isinstance(body, dict):
        return _bad("Request body must be a JSON object", None, "invalid_json")
    if (plan := _common(body, UNSUPPORTED_COMPLETION)) is not None:
        return plan
    prompt = body.get("prompt")
    if not isinstance(prompt, (str, list)):
        return _bad("'prompt' is required: a string or an array", "prompt")
    logprobs = body.get("logprobs")
    if logprobs is not None and (not isinstance(logprobs, int) or isinstance(logprobs, bool)
                                 or not 0 <= logprobs <= 5):
        return _bad("'logprobs' must be an integer between 0 and 5", "logprobs")
    best_of, n = body.get("best_of"), body.get("n") or 1
    if best_of is not None:
        if not isinstance(best_of, int) or isinstance(best_of, bool) or best_of < 1:
            return _bad("'best_of' must be an integer >= 1", "best_of")
        if best_of < n:
            return _bad("'best_of' must be greater than or equal to 'n'", "best_of")
        if best_of > 1 and body.get("stream") is True:
            return _bad("'best_of' > 1 results cannot be streamed", "best_of")
    return None


def _handler(chat: bool) -> Callable[[Call], Plan]:
    validate = validate_chat if chat else validate_completion

    def handle(call: Call) -> Plan:
        if (plan := preamble(call, error_plan)) is not None:
            return plan
        if not call.json_ok:
            return _bad("Request body is not valid JSON", None, "invalid_json")
        if (plan := validate(call.body)) is not None:
            return plan
        model = call.cfg.served_model or STYLE.default_model
        if chat:
            return (chat_stream if call.stream else chat_json)(call, STYLE, model)
        return (completion_stream if call.stream else completion_json)(call, STYLE, model)

    return handle


async def not_found(request: Request, exc: Exception) -> Response:
    body = {"error": {"message": f"Not Found: {request.method} {request.url.path}", "type": "invalid_request_error",
                      "param": None, "code": "not_found"}}
    return JSONResponse(body, status_code=404)


EXCEPTION_HANDLERS: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {404: not_found}


def routes(cfg: MockConfig, stats: Stats) -> list[Route]:
    return [
        Route("/chat", inference(cfg, stats, _handler(True)), methods=["POST"]),
        Route("/completion", inference(cfg, stats, _handler(False), scenarios.from_prompt), methods=["POST"]),
    ]
