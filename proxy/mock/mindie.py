"""Mock Huawei MindIE Server, OpenAI-compatible endpoints (`POST /v1/chat/completions`, `POST /v1/completions`).

Written from MindIE's documentation and server source (docs/upstreams.md "MindIE Server", "MindIE streaming"):

* Errors are `{"error": "<string>", "error_type": "<label>"}`; validation failures (also of `stream: true`
  requests, before any SSE) are 422 `Input Validation Error`, with the server's own messages, e.g.
  `Model not found`, `Parameter temperature must be in (0.0,2], got 3.`. 413 has its own `{"message": ...}` body,
  503 an empty body, an unhandled exception the raw text `Server internal error`.
* Ids are `endpoint_common_N`, or the value of the `req-id` request header.
* Non-stream: `message.tool_calls` is `[]` when there are none, `logprobs: null`, no `system_fingerprint`;
  `usage` carries `prompt_tokens_details.cached_tokens`, `batch_size` and `queue_wait_time` (one entry per generated
  token, queue wait in microseconds); `prefill_time` and `decode_time_arr` (one entry per decode step, i.e.
  completion_tokens - 1) sit at the top level.
* Stream: a first delta `{"role":"assistant","content":""}` per choice, then one chunk per generated token, each delta
  repeating `"role":"assistant"`. The last token's chunk carries `finish_reason` and `usage` (whether or not
  `stream_options` was sent: the server does not read it). Then `data: [DONE]`. With `n>1` each choice comes in its
  own chunk. Reasoning (when a reasoning parser is on: directive `reasoning_field`) rides in `reasoning_content`,
  and such deltas carry no `content` key.
* fullTextEnabled (`full_text=True`): every delta's `content` is the cumulative text and the finish chunk has a
  top-level `full_text`. `reasoning_content` stays a true delta.
* `max_tokens` defaults to maxIterTimes = 512.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from proxy.mock import scenario as scenarios
from proxy.mock.asgi import DONE, TEXT_HEADERS, Plan, Stats, body_plan, json_plan, sse, stream_plan, truncated_json_plan
from proxy.mock.common import (
    RAW_TIMEOUT,
    Call,
    MockConfig,
    Template,
    bearer_checker,
    connection_directives,
    inference,
    is_number,
    models_routes,
    requested_status,
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

MAX_ITER_TIMES = 512
MAX_INT32 = 2147483647
MAX_UINT64 = 18446744073709551615
MAX_REQUEST_BYTES = 40 * 1024 * 1024
MAX_STOP_NUM = 1024
MAX_STOP_LEN = 1024
MAX_STOP_TOTAL = 32768
ROLES = ("system", "user", "assistant", "tool")
# MindIE's chat completion document: "tool_call_id, tool_calls, tools, and tool_choice ... support only some models.
# An error may be reported if an unsupported model is used" (ChatGLM3-6B, DeepSeek-R1, Qwen2.5, Qwen3). The mock
# refuses tools to the families MindIE serves outside that list, as a 422 (a name it does not recognise, such as the
# tests' own, keeps its tools).
NO_TOOL_MODELS = re.compile(r"(?i)llama|baichuan|mi[sx]tral|internlm|gemma|chatglm2|telechat")
FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_\u4e00-\u9fa5-]{1,64}$")

ERRORS: dict[int, tuple[str, str]] = {
    400: ("Bad Request", "Bad Request"),
    404: ("Not Found", "NotFoundError"),
    422: ("Input validation error: rejected by the mock ([mock:error=422])", "Input Validation Error"),
    424: ("Generation failed", "Generation Error"),
    500: ("Engine callback timeout: server tokenTimeout", "Incomplete Generation"),
}


@dataclass(frozen=True)
class Flavour:
    """What differs between MindIE proper and services built on it (Siliconstorm)."""

    name: str = "mindie"
    default_model: str = "mindie-mock"
    perf_usage: bool = True          # usage.prompt_tokens_details / batch_size / queue_wait_time
    null_tool_calls: bool = False    # message.tool_calls when there are none: [] (MindIE) or null
    top_k_zero_ok: bool = False      # top_k range [0, ...] instead of (0, ...]
    # response_format types honoured (MindIE >= 2.3 does structured output); others are ignored, as before 2.3
    response_formats: tuple[str, ...] = ("text", "json_object", "json_schema")
    # tools only for the model families MindIE's document lists (`NO_TOOL_MODELS` are refused them)
    listed_tool_models: bool = True
    # hooks: return a plan to answer with, or None to carry on
    auth_error: Callable[[], Plan] | None = None
    pre: Callable[[Call], Plan | None] | None = None


def mindie_error(status: int, message: str | None = None, error_type: str | None = None) -> Plan:
    if status == 503:
        return body_plan(503, b"", [])
    if status == 413:
        return json_plan(413, {"message": "Request body too large. Maximum allowed size is 40MB."})
    default_msg, default_type = ERRORS.get(status, ("Error", "Error"))
    return json_plan(status, {"error": message or default_msg, "error_type": error_type or default_type})


def directive_error(status: int | str) -> Plan:
    if status == "raw500" or status == "raw":
        return body_plan(500, b"Server internal error", TEXT_HEADERS)
    if isinstance(status, int) and 100 <= status <= 599:
        return mindie_error(status)
    return mindie_error(500)


def _invalid(message: str) -> Plan:
    return mindie_error(422, message, "Input Validation Error")


def _auth_error() -> Plan:
    # The MindIE documents describe no API keys (the server uses mutual TLS); a gateway in front answers 401.
    return mindie_error(401, "Unauthorized: invalid or missing API key", "Unauthorized")


# ------------------------------------------------------------------------------------------------- validation

def _dump(value: Any) -> str:
    return orjson.dumps(value).decode()


def _check_float(body: dict[str, Any], key: str, ok: Callable[[float], bool], message: str) -> str | None:
    if key not in body or body[key] is None:
        return None
    value = body[key]
    if not is_number(value):
        return f"Parameter {key} must be float, got {_dump(value)}."
    return None if ok(float(value)) else message.format(_dump(value))


def _check_bool(body: dict[str, Any], key: str) -> str | None:
    if key in body and body[key] is not None and not isinstance(body[key], bool):
        return f"Parameter {key} must be bool, got {_dump(body[key])}."
    return None


def _check_uint(body: dict[str, Any], key: str, lo: int, hi: int, message: str) -> str | None:
    if key not in body or body[key] is None:
        return None
    value = body[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return f"Parameter {key} must be uint32, got {_dump(value)}."
    return None if lo <= value <= hi else message.format(_dump(value))


def _check_stop(stop: Any) -> str | None:
    if stop is None:
        return None
    if isinstance(stop, str):
        if not 1 <= len(stop) <= MAX_STOP_LEN:
            return f"Input validation error: length of `stop` must be in [1, {MAX_STOP_LEN}], but got {len(stop)}"
        return None
    if isinstance(stop, list):
        bad = any(not isinstance(s, str) or not 1 <= len(s) <= MAX_STOP_LEN for s in stop)
        total = sum(len(s) for s in stop if isinstance(s, str))
        if bad or total > MAX_STOP_TOTAL or len(stop) > MAX_STOP_NUM:
            return (f"Input validation error: `stop` must be list[string] if list, and item length in "
                    f"[1, {MAX_STOP_LEN}] with total <= {MAX_STOP_TOTAL}")
        return None
    return "Input validation error: param stop must be string or list[string]"


def _check_sampling(body: dict[str, Any], flavour: Flavour, *, chat: bool) -> str | None:
    """The SetupInferParams checks shared by chat and completions."""
    checks: list[str | None] = [
        _check_bool(body, "ignore_eos"),
        _check_stop(body.get("stop")),
    ]
    ids = body.get("stop_token_ids")
    if ids is not None and not isinstance(ids, list):
        checks.append("Parameter stop_token_ids not array")
    elif isinstance(ids, list) and any(not isinstance(i, int) or isinstance(i, bool) for i in ids):
        checks.append("Parameter stop_token_ids not list[int]")
    if "stop" in body or "stop_token_ids" in body:
        checks.append(_check_bool(body, "include_stop_str_in_output"))
    checks += [
        _check_float(body, "temperature", lambda v: 0.0 <= v <= 2.0,
                     "Parameter temperature must be in (0.0,2], got {}."),
    ]
    top_k = body.get("top_k")
    if top_k is not None:
        if not isinstance(top_k, int) or isinstance(top_k, bool):
            checks.append(f"Parameter top_k must be integer, got {_dump(top_k)}.")
        elif top_k != -1 and not ((0 if flavour.top_k_zero_ok else 1) <= top_k <= MAX_INT32):
            checks.append(f"Parameter top_k must be in -1 || (0,{MAX_INT32}], got {_dump(top_k)}")
    checks += [
        _check_float(body, "top_p", lambda v: 0.0 < v <= 1.0, "Parameter top_p must be in (0.0,1.0], got {}."),
        _check_uint(body, "seed", 0, MAX_UINT64, f"Parameter seed must be in [0, {MAX_UINT64}], got {{}}."),
        _check_float(body, "repetition_penalty", lambda v: 0.0 < v <= 2.0,
                     "Parameter 'repetition_penalty' must be in (0.0, 2], got {}."),
        _check_float(body, "frequency_penalty", lambda v: -2.0 <= v <= 2.0,
                     "Parameter frequency_penalty should be in [-2.0, 2.0], got {}."),
        _check_float(body, "presence_penalty", lambda v: -2.0 <= v <= 2.0,
                     "Parameter presence_penalty not in [-2.0, 2.0], but got {}."),
        _check_bool(body, "skip_special_tokens"),
        _check_uint(body, "best_of", 1, 128, "Parameter [best_of] should be in [1, 128], got {}."),
        _check_uint(body, "n", 1, 128, "Parameter [n] should be in [1, 128], got {}."),
        _check_bool(body, "use_beam_search"),
    ]
    if chat:
        checks += [
            _check_bool(body, "logprobs"),
            _check_uint(body, "top_logprobs", 0, 20, "Parameter top logprobs must be in [0, 20], got {}."),
        ]
        if body.get("logprobs") is False and body.get("top_logprobs") is not None:
            checks.append("Value error, when using top_logprobs, logprobs must be true or null in chat completions")
    else:
        checks.append(_check_uint(body, "logprobs", 0, 5, "logprobs should be in range [0, 5], got {}."))
    max_tokens = body.get("max_tokens")
    if max_tokens is not None:
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
            checks.append("Parameter max_tokens not number_integer")
        elif not 0 < max_tokens <= MAX_INT32:
            checks.append(f"Parameter max_tokens must be (0,{MAX_INT32}], got {max_tokens}")
    if "stream" in body and not isinstance(body["stream"], bool):
        checks.append(f"Parameter stream must be bool, got {_dump(body['stream'])}.")
    for message in checks:
        if message:
            return message
    n, best_of = body.get("n"), body.get("best_of")
    stream = body.get("stream") is True
    if best_of is not None and stream and best_of != n:
        return f"best_of must be equal to n in stream mode, but best_of is {best_of}, n is {n}."
    if best_of is not None and n is not None and best_of < n:
        return f"best_of must be greater than or equal to n, but best_of is {best_of}, n is {n}."
    count = max(n or 1, best_of or 1)
    temperature = body.get("temperature")
    if count > 1 and not temperature:
        return ("best_of/n can not greater than 1 without using beam search when temperature is 0 or not set, "
                f"but best_of is {best_of if best_of is not None else 'None'}, n is {n if n is not None else 'None'}.")
    return None


def _check_tool(tool: Any) -> str | None:
    if not isinstance(tool, dict) or "type" not in tool:
        return "Tool param invalid, tool type not exist"
    if tool["type"] != "function":
        return "Tool param not function type"
    fn = tool.get("function")
    if not isinstance(fn, dict):
        return "Tool param invalid function object"
    name = fn.get("name")
    if not isinstance(name, str):
        return "Function object invalid name type"
    if not FUNCTION_NAME.match(name):
        return ("The name of function must be a-z, A-Z, 0-9, common chinese characters, underscores and dashe "
                f"within max length of 64, unexpected function name: {name}")
    return None


def _check_tool_call(call: Any) -> str | None:
    if not isinstance(call, dict) or call.get("id") is None:
        return "Tool call param contains no id."
    if not isinstance(call["id"], str):
        return 'Tool call param "id" arguments expected to be a string'
    if call.get("type") != "function":
        return "The type of the tool. Currently, only function is supported."
    fn = call.get("function")
    if not isinstance(fn, dict):
        return "Tool call param contains no function that the model called."
    if not isinstance(fn.get("name"), str):
        return "Tool call param contains no function name"
    if not isinstance(fn.get("arguments"), str):
        return "Tool call param contains no function arguments"
    return None


def _check_messages(messages: Any, with_tools: bool) -> str | None:
    if messages is None:
        return "Request param contains not messages or messages null"
    if not isinstance(messages, list) or not messages:
        return "Request param messages not arr or arr is empty"
    for message in messages:
        if not isinstance(message, dict) or message.get("role") is None:
            return "Request param contains not role or role null"
        role = message["role"]
        if role not in ROLES and (with_tools or role != "developer"):
            return "Request param contains role must be system, assistant, user or tool"
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id is None:
                return "Request param contains not tool_call_id or tool_call_id null while role is tool"
            if not isinstance(call_id, str):
                return "The type of tool_call_id is abnormal"
            if not call_id:
                return "Request param tool_call_id len should not be 0 while role is tool"
        content = message.get("content")
        if role == "assistant":
            if message.get("tool_calls") is not None:
                calls = message["tool_calls"]
                for call in calls if isinstance(calls, list) else [calls]:
                    if (err := _check_tool_call(call)) is not None:
                        return err
                continue
            if content is None:
                return "Request param contains not content or content null"
            if isinstance(content, list):
                content = scenarios.content_text(content)
            if not isinstance(content, str):
                return 'Request param "content" arguments expected to be a string'
            if not content:
                return 'Request param "content" should not be empty'
            continue
        if content is None:
            return "Request param contains not content or content null"
        if isinstance(content, list):
            if not content:
                return "Inputs arr is empty"
            if any(isinstance(p, dict) and "text" in p and not isinstance(p["text"], str) for p in content):
                return "Request param text must be string"
        elif not isinstance(content, str):
            return "The type of inputs is abnormal"
        elif with_tools and role != "tool" and not content:
            return "Request param content len should not be 0"
    return None


def _check_model(body: dict[str, Any], served: str | None, not_found: str) -> str | None:
    model = body.get("model")
    if model is None:
        return "Request contains not model or model null"
    if not isinstance(model, str):
        return "Request param model must be string"
    if not model:
        return "Request param model must be not empty"
    if served is not None and model != served:
        return not_found
    return None


def validate_chat(body: Any, cfg: MockConfig, flavour: Flavour) -> str | None:
    if not isinstance(body, dict):
        return "Check open ai req parameter error"
    if (err := _check_model(body, cfg.served_model, "Model not found")) is not None:
        return err
    choice = body.get("tool_choice")
    if choice is not None:
        if isinstance(choice, str):
            if choice not in ("none", "auto", "required"):
                return "Parameter tool_choice string not in [none, auto, required]"
        elif isinstance(choice, dict):
            if (err := _check_tool(choice)) is not None:
                return err
        else:
            return "Parameter tool_choice not string or object"
    tools = body.get("tools")
    if tools:
        if not isinstance(tools, list):
            return "Tools not array"
        for tool in tools:
            if (err := _check_tool(tool)) is not None:
                return err
    if tools and choice != "none" and flavour.listed_tool_models and NO_TOOL_MODELS.search(body["model"]):
        return f"Model {body['model']} does not support function call (tools)"
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict):
            return "chat_template_kwargsmust be a JSON object"
        if kwargs.get("enable_thinking") is not None and not isinstance(kwargs["enable_thinking"], bool):
            return "Parameter enable_thinking must be bool"
    if (err := _check_messages(body.get("messages"), bool(tools))) is not None:
        return err
    return _check_sampling(body, flavour, chat=True)


def validate_completion(body: Any, cfg: MockConfig, flavour: Flavour) -> str | None:
    if not isinstance(body, dict):
        return "Check open ai req parameter error"
    not_found = "Not found given model, please check modelName in config file."
    if (err := _check_model(body, cfg.served_model, not_found)) is not None:
        return err
    prompt = body.get("prompt")
    if prompt is None:
        return "Contains not prompt or prompt null"
    if isinstance(prompt, str):
        if not prompt:
            return "Length of Prompt text should be greater than 0 and less than or equal to 4194304, but got 0"
    elif isinstance(prompt, list):
        if not prompt:
            return "Prompt array cannot be empty."
        if any(not isinstance(t, int) or isinstance(t, bool) for t in prompt):
            return "All elements of the prompt array must be integers."
    else:
        return "The type of prompt is abnormal,prompt must be str or integer list."
    return _check_sampling(body, flavour, chat=False)


# -------------------------------------------------------------------------------------------------- responses

def _perf(completion: int, sc: Scenario) -> tuple[list[int], list[int], int, list[int]]:
    """batch_size, queue_wait_time (us), prefill_time, decode_time_arr: plausible numbers shaped like the spec's."""
    decode_ms = sc.num("delay_ms", 27, lo=1) or 27
    prefill_ms = sc.num("first_byte_ms", 39, lo=1) or 39
    queue = [5148] + [60] * (completion - 1) if completion else []
    return [1] * completion, queue, prefill_ms, [decode_ms] * max(0, completion - 1)


def _usage(prompt: int, gen_tokens: int, reasoning: int, sc: Scenario, flavour: Flavour) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": prompt}
    if flavour.perf_usage:
        usage["prompt_tokens_details"] = {"cached_tokens": 0}
    usage["completion_tokens"] = gen_tokens
    if reasoning:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    usage["total_tokens"] = prompt + gen_tokens
    if flavour.perf_usage:
        usage["batch_size"], usage["queue_wait_time"], _, _ = _perf(gen_tokens, sc)
    return usage


def _delta(piece: Piece, full_text: bool, noindex: bool) -> dict[str, Any]:
    if piece.kind == "tool":
        info = piece.tool or {}
        if "id" in info:
            call: dict[str, Any] = {"index": info["index"], "id": info["id"], "type": "function",
                                    "function": {"name": info["name"]}}
        else:
            call = {"index": info["index"], "function": {"arguments": info["arguments"]}}
        if noindex:
            del call["index"]
        return {"role": "assistant", "tool_calls": [call]}
    if piece.kind == "content":
        return {"role": "assistant", "content": piece.full if full_text else piece.text}
    # fullTextEnabled makes only `content` cumulative: reasoning_content stays a true delta.
    return {"role": "assistant", "reasoning_content": piece.text}


def _choices(call: Call) -> int:
    body = call.body
    directive = call.scenario.num("n", None, lo=1, hi=16)
    if directive is not None:
        return directive
    n = body.get("n") if isinstance(body.get("n"), int) else None
    best_of = body.get("best_of") if isinstance(body.get("best_of"), int) else None
    return max(1, min(16, n or best_of or 1))


def _generations(call: Call, flavour: Flavour, *, text_only: bool = False) -> list[Generation]:
    body = call.body
    max_tokens = body.get("max_tokens") if isinstance(body.get("max_tokens"), int) else None
    sc = call.scenario
    max_iter = sc.num("max_iter", MAX_ITER_TIMES, lo=1, hi=100_000) or MAX_ITER_TIMES  # the server's maxIterTimes
    cap = min(max_tokens or max_iter, max_iter)
    if text_only:
        sc = Scenario({k: v for k, v in sc.flags.items()
                       if k not in ("reasoning_field", "tool_calls", "tool_calls_noindex")})
    else:
        sc = scenarios.r1_thinking(body, sc)
    names = tool_names(body)
    reply = None if text_only else structured_reply(body, flavour.response_formats, sc)
    return [generate(sc, dialect=flavour.name, max_tokens=cap, tools=names, reply=reply)
            for _ in range(_choices(call))]



def chat_stream(call: Call, flavour: Flavour) -> Plan:
    cfg, sc = call.cfg, call.scenario
    gens = _generations(call, flavour)
    ident = call.headers.get("req-id") or f"endpoint_common_{call.seq}"
    base = {"id": ident, "object": "chat.completion.chunk", "created": call.created, "model": call.model}
    prompt = prompt_tokens_chat(call.body.get("messages"))
    noindex = sc.has("tool_calls_noindex")
    no_finish = sc.has("no_finish")
    full = cfg.full_text

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None,
              top: dict[str, Any] | None = None) -> dict[str, Any]:
        obj = dict(base)
        if top:
            obj.update(top)
        obj["choices"] = [{"index": index, "delta": delta, "finish_reason": finish}]
        return obj

    head = [sse(chunk(i, {"role": "assistant", "content": ""})) for i in range(len(gens))]
    content_tpl = [Template(chunk(i, {"role": "assistant", "content": Template.SLOT})) for i in range(len(gens))]
    per_choice: list[list[bytes]] = []
    for i, gen in enumerate(gens):
        frames: list[bytes] = []
        pieces = gen.pieces or [Piece("content", "", "")]
        last = len(pieces) - 1
        tpl = content_tpl[i]
        for j, piece in enumerate(pieces):
            if j != last and piece.kind == "content":
                frames.append(tpl.frame(piece.full if full else piece.text))
            elif j == last and not no_finish:
                top: dict[str, Any] = {}
                if full:
                    top["full_text"] = gen.content
                top["usage"] = _usage(prompt, gen.completion_tokens, gen.reasoning_tokens, sc, flavour)
                frames.append(sse(chunk(i, _delta(piece, full, noindex), gen.finish_reason, top)))
            elif piece.kind == "content":
                frames.append(tpl.frame(piece.full if full else piece.text))
            else:
                frames.append(sse(chunk(i, _delta(piece, full, noindex))))
        per_choice.append(frames)
    return stream_plan(head, _interleave(per_choice), [DONE], finish_in_body=not no_finish, **stream_directives(sc))


def _interleave(per_choice: list[list[bytes]]) -> list[bytes]:
    """One choice per chunk, round-robin (MindIE sends each choice of n>1 in its own chunk)."""
    if len(per_choice) == 1:
        return per_choice[0]
    body: list[bytes] = []
    for step in range(max(len(f) for f in per_choice)):
        body += [frames[step] for frames in per_choice if step < len(frames)]
    return body


def chat_json(call: Call, flavour: Flavour) -> Plan:
    sc = call.scenario
    gens = _generations(call, flavour)
    ident = call.headers.get("req-id") or f"endpoint_common_{call.seq}"
    prompt = prompt_tokens_chat(call.body.get("messages"))
    choices = []
    for i, gen in enumerate(gens):
        message: dict[str, Any] = {"role": "assistant", "content": "" if gen.tool_calls else gen.content}
        if gen.reasoning_tokens:
            message["reasoning_content"] = gen.reasoning
        message["tool_calls"] = gen.tool_calls or (None if flavour.null_tool_calls else [])
        choices.append({"index": i, "message": message, "logprobs": None, "finish_reason": gen.finish_reason})
    completion = sum(g.completion_tokens for g in gens)
    reasoning = sum(g.reasoning_tokens for g in gens)
    _, _, prefill, decode = _perf(max(g.completion_tokens for g in gens), sc)
    obj = {"id": ident, "object": "chat.completion", "created": call.created, "model": call.model,
           "choices": choices, "usage": _usage(prompt, completion, reasoning, sc, flavour),
           "prefill_time": prefill, "decode_time_arr": decode}
    return _json_body(obj, sc)


def _json_body(obj: dict[str, Any], sc: Scenario) -> Plan:
    data = orjson.dumps(obj)
    if sc.has("drop"):
        return truncated_json_plan(data)
    return body_plan(200, data)


def completion_stream(call: Call, flavour: Flavour) -> Plan:
    cfg, sc = call.cfg, call.scenario
    gens = _generations(call, flavour, text_only=True)
    ident = call.headers.get("req-id") or f"endpoint_common_{call.seq}"
    base = {"id": ident, "object": "text_completion", "created": call.created, "model": call.model}
    prompt = prompt_tokens_text(call.body.get("prompt"))
    no_finish = sc.has("no_finish")

    def chunk(index: int, text: Any, finish: str | None = None, usage: dict[str, Any] | None = None) -> Any:
        obj = dict(base)
        obj["choices"] = [{"index": index, "text": text, "logprobs": None, "stop_reason": None,
                           "finish_reason": finish}]
        if usage is not None:
            obj["usage"] = usage
        return obj

    templates = [Template(chunk(i, Template.SLOT)) for i in range(len(gens))]
    per_choice: list[list[bytes]] = []
    for i, gen in enumerate(gens):
        pieces = gen.pieces or [Piece("content", "", "")]
        frames = [templates[i].frame(p.full if cfg.full_text else p.text) for p in pieces[:-1]]
        last = pieces[-1]
        text = last.full if cfg.full_text else last.text
        if no_finish:
            frames.append(templates[i].frame(text))
        else:
            usage = _usage(prompt, gen.completion_tokens, 0, sc, flavour)
            frames.append(sse(chunk(i, text, gen.finish_reason, usage)))
        per_choice.append(frames)
    return stream_plan([], _interleave(per_choice), [DONE], finish_in_body=not no_finish, **stream_directives(sc))


def completion_json(call: Call, flavour: Flavour) -> Plan:
    sc = call.scenario
    gens = _generations(call, flavour, text_only=True)
    ident = call.headers.get("req-id") or f"endpoint_common_{call.seq}"
    prompt = prompt_tokens_text(call.body.get("prompt"))
    choices = [{"index": i, "text": g.content, "logprobs": None, "stop_reason": None,
                "finish_reason": g.finish_reason} for i, g in enumerate(gens)]
    completion = sum(g.completion_tokens for g in gens)
    obj = {"id": ident, "object": "text_completion", "created": call.created, "model": call.model,
           "choices": choices, "usage": _usage(prompt, completion, 0, sc, flavour)}
    return _json_body(obj, sc)


# ----------------------------------------------------------------------------------------------------- routes

def _handler(flavour: Flavour, chat: bool) -> Callable[[Call], Plan]:
    validate = validate_chat if chat else validate_completion
    stream_fn = chat_stream if chat else completion_stream
    json_fn = chat_json if chat else completion_json

    def handle(call: Call) -> Plan:
        if not call.authorized:
            return (flavour.auth_error or _auth_error)()
        if flavour.pre is not None and (plan := flavour.pre(call)) is not None:
            return plan
        if len(call.raw) > MAX_REQUEST_BYTES:
            return mindie_error(413)
        if (plan := connection_directives(call.scenario)) is not None:
            return plan
        if (status := requested_status(call.scenario)) is not None:
            return directive_error(status)
        if not call.json_ok:
            return _invalid("Failed to parse the request body as JSON")
        if (err := validate(call.body, call.cfg, flavour)) is not None:
            return _invalid(err)
        if call.body.get("stream") is True:
            return stream_fn(call, flavour)
        if call.scenario.has("raw_timeout"):  # without SSE, the engine timeout is an ordinary JSON error
            return mindie_error(500, RAW_TIMEOUT.decode(), "Incomplete Generation")
        return json_fn(call, flavour)

    return handle


# The engine's load as its metrics port shows it (metricsPort with MIES_SERVICE_MONITOR_MODE=1): MindIE's own names,
# labelled model_name, refreshed once a second. The mock's engine schedules MAX_BATCH requests at once (the rest
# wait), and each running request holds KV_CACHE_PER_REQUEST of the NPU KV cache.
METRICS_REFRESH = 1.0
MAX_BATCH = 16
KV_CACHE_PER_REQUEST = 0.05


class EngineGauges:
    """num_requests_waiting, num_requests_running and npu_cache_usage_perc, read from the mock's own in-flight count
    at most once per METRICS_REFRESH seconds (a scrape between two refreshes gets the earlier values)."""

    def __init__(self, stats: Stats, model: str) -> None:
        self.stats = stats
        self.model = model
        self.values = (0, 0, 0.0)
        self.taken = -METRICS_REFRESH

    def text(self) -> str:
        now = time.monotonic()
        if now - self.taken >= METRICS_REFRESH:
            in_flight = max(self.stats.in_flight, 0)
            running = min(in_flight, MAX_BATCH)
            self.values = (in_flight - running, running, min(1.0, running * KV_CACHE_PER_REQUEST))
            self.taken = now
        waiting, running, cache = self.values
        label = f'{{model_name="{self.model}"}}'
        return (f"# HELP num_requests_waiting Number of requests waiting to be processed.\n"
                f"# TYPE num_requests_waiting gauge\nnum_requests_waiting{label} {waiting}\n"
                f"# HELP num_requests_running Number of requests currently running.\n"
                f"# TYPE num_requests_running gauge\nnum_requests_running{label} {running}\n"
                f"# HELP npu_cache_usage_perc NPU KV-cache usage. 1 means 100 percent usage.\n"
                f"# TYPE npu_cache_usage_perc gauge\nnpu_cache_usage_perc{label} {cache}\n")


def metrics_routes(cfg: MockConfig, stats: Stats, flavour: Flavour | None = None) -> list[Route]:
    """What MindIE serves on its metrics port: GET /metrics (Prometheus text, its own unprefixed names)."""
    gauges = EngineGauges(stats, cfg.served_model or (flavour or Flavour()).default_model)

    async def metrics(request: Request) -> Response:
        return Response(gauges.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return [Route("/metrics", metrics, methods=["GET"])]


def routes(cfg: MockConfig, stats: Stats, flavour: Flavour | None = None) -> list[Route]:
    flavour = flavour or Flavour()
    names = [cfg.served_model or flavour.default_model]
    auth_plan = flavour.auth_error or _auth_error

    def denied() -> Response:
        return static_response(auth_plan())

    def not_found(name: str) -> Response:
        return JSONResponse({"error": "Model not found", "error_type": "NotFoundError"}, status_code=404)

    async def live(request: Request) -> Response:
        return Response(status_code=200)

    return [
        Route("/v1/chat/completions", inference(cfg, stats, _handler(flavour, True)), methods=["POST"]),
        Route("/v1/completions", inference(cfg, stats, _handler(flavour, False), scenarios.from_prompt),
              methods=["POST"]),
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", live, methods=["GET"]),
        *models_routes(stats, names, "MindIE Server", check_auth=bearer_checker(cfg, denied),
                       not_found=not_found),
    ]
