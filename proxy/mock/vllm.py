"""Mock vLLM OpenAI-compatible server (`vllm serve`; vLLM-Ascend serves the same API): `POST /v1/chat/completions`,
`POST /v1/completions`, `GET /v1/models`, `GET /version`, `GET /health`; and its own Responses and Anthropic
Messages APIs (`POST /v1/responses`, `POST /v1/messages`: responses_api.py, anthropic_api.py) for native passthrough.

Written from vLLM's own source (vllm/entrypoints/openai: the chat protocol and serving modules, the hermes tool
parser, the API server's error handlers), for a server started as

    vllm serve Qwen/Qwen3-8B --reasoning-parser qwen3 --enable-auto-tool-choice --tool-call-parser hermes \
        --enable-prompt-tokens-details

* Models: one card `{"id", "object": "model", "created", "owned_by": "vllm", "root", "parent": null,
  "max_model_len", "permission": [...]}`. `GET /version` answers `{"version": ...}` and `GET /health` 200 with an empty
  body (503 with the server-wide directive `unhealthy`); neither needs the key (`--api-key` guards `/v1` paths only,
  with 401 `{"error": "Unauthorized"}`).
* Streams are serialised as vLLM does (`exclude_unset`): no `usage` key on ordinary chunks; a first chunk per choice
  with `{"role": "assistant", "content": ""}`; then one chunk per token, **the last token's delta riding on the chunk
  that carries `finish_reason`** (and `stop_reason`); with `stream_options.include_usage` a final `choices: []` chunk
  with the usage (`prompt_tokens_details.cached_tokens` always, `completion_tokens_details.reasoning_tokens` from a
  reasoning parser in today's releases); with `continuous_usage_stats` too, every chunk carries the running usage.
* Reasoning (directive `reasoning_field`: the reasoning parser's output; none when the request sets
  `chat_template_kwargs.enable_thinking: false`, Qwen3's template switch) in the field the release names: today's
  (>= 0.16) `reasoning`; flavour `v0.15` (0.11.1 to 0.15) both `reasoning` and its deprecated alias
  `reasoning_content`, with the same text; flavour `v0.10` (<= 0.11.0) `reasoning_content`.
* Tool calls as the hermes parser streams them: a call's first delta `{"id": "chatcmpl-tool-<32 hex>", "type":
  "function", "index", "function": {"name"}}`, then `{"index", "function": {"arguments"}}` pieces, the last one on the
  finish chunk. finish_reason `tool_calls` for `auto` and `required`, `stop` for a named `tool_choice` (vLLM follows
  OpenAI there). Non-stream: `message.tool_calls`, content null (auto) or "" (required, named).
* `response_format` `json_object` and `json_schema` are honoured (an instance of the schema); `json_schema` without its
  `json_schema` object is a 400. `reasoning_effort` outside the release's set is a 400 (`v0.10`, `v0.15`: low, medium,
  high; today: none, minimal, low, medium, high, xhigh, max).
* Directive `cached=N`: `prompt_tokens_details.cached_tokens` is N (vLLM's prefix cache hits, in whole blocks).
* Errors (directive `error=STATUS`, validation, unknown model): `{"error": {"message", "type", "param", "code": <the
  status>}}` since 0.10.1; flavour `v0.10` the flat `{"object": "error", "message", "type", "param", "code"}`. Types as
  vLLM names them: `BadRequestError`, `NotFoundError`, `InternalServerError`, ...
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from proxy.mock import anthropic_api, responses_api, retrieval
from proxy.mock import scenario as scenarios
from proxy.mock.asgi import DONE, Plan, Stats, json_plan, sse, stream_plan
from proxy.mock.common import Call, MockConfig, bearer_checker, inference, int_param, preamble, stream_directives
from proxy.mock.openai import Style, completion_json, completion_stream, json_body
from proxy.mock.textgen import Generation, Piece, generate, prompt_tokens_chat, structured_reply, tool_names

DEFAULT_MODEL = "Qwen/Qwen3-8B"
MAX_MODEL_LEN = 32768
V015 = "v0.15"
V010 = "v0.10"
FLAVOURS = {
    V015: "vLLM 0.11.1 to 0.15: reasoning in both `reasoning` and its deprecated alias `reasoning_content`; "
          "reasoning_effort low|medium|high only",
    V010: "vLLM 0.10.0 and before: reasoning in `reasoning_content`, flat errors {\"object\": \"error\", ...}",
}
VERSIONS = {"": "0.20.0", V015: "0.15.1", V010: "0.10.0"}
EFFORTS_TODAY = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
EFFORTS_BEFORE = ("low", "medium", "high")
ERROR_TYPES = {400: "BadRequestError", 401: "Unauthorized", 404: "NotFoundError", 422: "BadRequestError",
               429: "TooManyRequests", 500: "InternalServerError", 501: "NotImplementedError",
               503: "ServiceUnavailable"}
STYLE = Style(name="vllm", fingerprint=None, refusal=False, default_model=DEFAULT_MODEL)


def _reasoning_fields(flavour: str) -> tuple[str, ...]:
    return {V015: ("reasoning", "reasoning_content"), V010: ("reasoning_content",)}.get(flavour, ("reasoning",))


def error_plan(flavour: str, status: int, message: str | None = None, param: str | None = None) -> Plan:
    text = message or f"Mock error (mock directive error={status})"
    type_ = ERROR_TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")
    if status == 401:  # the --api-key middleware's own answer
        return json_plan(401, {"error": "Unauthorized"})
    info = {"message": text, "type": type_, "param": param, "code": status}
    return json_plan(status, {"object": "error", **info} if flavour == V010 else {"error": info})


def _tool_id() -> str:
    return "chatcmpl-tool-" + uuid.uuid4().hex


def _validate(call: Call, model: str) -> Plan | None:
    flavour, body = call.cfg.flavour, call.body

    def bad(message: str, param: str | None = None) -> Plan:
        return error_plan(flavour, 400, message, param)

    if not call.json_ok or not isinstance(body, dict):
        return bad("JSON decode error")
    if not isinstance(body.get("messages"), list):
        return bad("1 validation error for ChatCompletionRequest\nmessages\n  Input should be a valid list",
                   "messages")
    if call.cfg.served_model is not None and model != call.cfg.served_model:
        return error_plan(flavour, 404, f"The model `{model}` does not exist.", "model")
    if body.get("stream_options") is not None and body.get("stream") is not True:
        return bad("Stream options can only be defined when `stream=True`.", "stream_options")
    choice = body.get("tool_choice")
    if choice not in (None, "none") and not body.get("tools"):
        return bad("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if isinstance(choice, dict) and choice.get("function", {}).get("name") not in tool_names(body):
        return bad("The tool specified in `tool_choice` does not match any of the specified `tools`", "tool_choice")
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and fmt.get("json_schema") is None:
        return bad("When response_format type is 'json_schema', the 'json_schema' field must be provided.",
                   "response_format")
    effort = body.get("reasoning_effort")
    allowed = EFFORTS_TODAY if flavour == "" else EFFORTS_BEFORE
    if effort is not None and effort not in allowed:
        return bad(f"1 validation error for ChatCompletionRequest\nreasoning_effort\n  Input should be "
                   f"{', '.join(repr(e) for e in allowed)}", "reasoning_effort")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        return bad("1 validation error for ChatCompletionRequest\nchat_template_kwargs\n  Input should be a valid "
                   "dictionary", "chat_template_kwargs")
    return None


def _generations(call: Call) -> list[Generation]:
    body = call.body
    sc = call.scenario
    kwargs = body.get("chat_template_kwargs")
    if isinstance(kwargs, dict) and kwargs.get("enable_thinking") is False and sc.has("reasoning_field"):
        # Qwen3's template with thinking switched off: the model writes no reasoning for the parser to find
        sc = scenarios.Scenario({k: v for k, v in sc.flags.items() if k != "reasoning_field"}, sc.tool_call, sc.reply)
    n = max(1, min(16, int_param(body, "n") or 1))
    max_tokens = int_param(body, "max_completion_tokens") or int_param(body, "max_tokens")
    reply = structured_reply(body, ("json_object", "json_schema"))
    return [generate(sc, dialect="vllm", max_tokens=max_tokens, tools=tool_names(body), id_factory=_tool_id,
                     reply=reply) for _ in range(n)]


def _finish(call: Call, gen: Generation) -> str | None:
    named = isinstance(call.body.get("tool_choice"), dict)
    return "stop" if named and gen.finish_reason == "tool_calls" else gen.finish_reason


def _usage(call: Call, gens: list[Generation], completion: int | None = None) -> dict[str, Any]:
    prompt = prompt_tokens_chat(call.body.get("messages"))
    done = sum(g.completion_tokens for g in gens) if completion is None else completion
    usage: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + done, "completion_tokens": done}
    if completion is None:
        cached = call.scenario.num("cached", 0, lo=0) or 0
        usage["prompt_tokens_details"] = {"cached_tokens": min(cached, prompt)}
    if call.cfg.flavour == "":
        usage["completion_tokens_details"] = {"reasoning_tokens": sum(g.reasoning_tokens for g in gens)}
    return usage


def _delta(piece: Piece, fields: tuple[str, ...]) -> dict[str, Any]:
    if piece.kind == "content":
        return {"content": piece.text}
    if piece.kind == "reasoning":
        return dict.fromkeys(fields, piece.text)
    info = piece.tool or {}
    if "id" in info:
        call = {"id": info["id"], "type": "function", "index": info["index"], "function": {"name": info["name"]}}
    else:
        call = {"index": info["index"], "function": {"arguments": info["arguments"]}}
    return {"tool_calls": [call]}


def chat_stream(call: Call, model: str) -> Plan:
    sc = call.scenario
    today = call.cfg.flavour == ""
    opts = call.body.get("stream_options")
    usage_on = call.include_usage
    continuous = usage_on and isinstance(opts, dict) and opts.get("continuous_usage_stats") is True
    fields = _reasoning_fields(call.cfg.flavour)
    gens = _generations(call)
    base: dict[str, Any] = {"id": "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion.chunk",
                            "created": call.created, "model": model}
    done = [0] * len(gens)

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, last: bool = False,
              first: bool = False) -> bytes:
        choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        if last:
            choice["stop_reason"] = None
        if today and not first:
            choice["token_ids"] = None
        obj: dict[str, Any] = {**base, "choices": [choice]}
        if first and today:
            obj["prompt_token_ids"] = None  # set on the first chunk only (return_token_ids)
        if continuous:
            obj["usage"] = _usage(call, gens, done[index])
        return sse(obj)

    head = [chunk(i, {"role": "assistant", "content": ""}, first=True) for i in range(len(gens))]
    per_choice: list[list[bytes]] = []
    for i, gen in enumerate(gens):
        frames = []
        finish = None if sc.has("no_finish") else _finish(call, gen)
        pieces = gen.pieces or [Piece("content", "", "")]
        for k, piece in enumerate(pieces):
            done[i] += 1 if gen.pieces else 0
            end = k == len(pieces) - 1 and finish is not None
            frames.append(chunk(i, _delta(piece, fields), finish if end else None, last=end))
        per_choice.append(frames)
    # n > 1: the choices' chunks interleave, one token of each in turn
    body = [frames[step] for step in range(max(map(len, per_choice))) for frames in per_choice if step < len(frames)]
    tail: list[bytes] = []
    if usage_on:
        tail.append(sse({**base, "choices": [], "usage": _usage(call, gens)}))
    tail.append(DONE)
    return stream_plan(head, body, tail, **stream_directives(sc))


def chat_json(call: Call, model: str) -> Plan:
    flavour = call.cfg.flavour
    gens = _generations(call)
    forced = call.body.get("tool_choice") == "required" or isinstance(call.body.get("tool_choice"), dict)
    choices = []
    for i, gen in enumerate(gens):
        message: dict[str, Any] = {"role": "assistant", "content": gen.content or None, "refusal": None,
                                   "annotations": None, "audio": None, "function_call": None}
        if gen.tool_calls:
            message["content"] = "" if forced else None
        if gen.tool_calls or flavour != "":
            message["tool_calls"] = gen.tool_calls
        for name in _reasoning_fields(flavour):
            message[name] = gen.reasoning or None
        choice: dict[str, Any] = {"index": i, "message": message, "logprobs": None, "finish_reason": _finish(call, gen),
                                  "stop_reason": None}
        if flavour == "":
            choice["token_ids"] = None
        choices.append(choice)
    obj = {"id": "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion", "created": call.created, "model": model,
           "choices": choices, "service_tier": None, "system_fingerprint": None, "usage": _usage(call, gens),
           "prompt_logprobs": None, "prompt_token_ids": None, "kv_transfer_params": None}
    return json_body(obj, call.scenario)


def _handler(chat: bool) -> Callable[[Call], Plan]:
    def handle(call: Call) -> Plan:
        flavour = call.cfg.flavour
        if (plan := preamble(call, lambda status: error_plan(flavour, status))) is not None:
            return plan
        model = call.model or call.cfg.served_model or DEFAULT_MODEL
        if chat:
            if (plan := _validate(call, model)) is not None:
                return plan
            return (chat_stream if call.stream else chat_json)(call, model)
        if not call.json_ok or not isinstance(call.body, dict) or "prompt" not in call.body:
            return error_plan(flavour, 400, "Either prompt or prompt_embeds must be provided and non-empty.",
                              "prompt")
        return (completion_stream if call.stream else completion_json)(call, STYLE, model)

    return handle


def routes(cfg: MockConfig, stats: Stats) -> list[Route]:
    name = cfg.served_model or DEFAULT_MODEL

    def denied() -> Response:
        return JSONResponse({"error": "Unauthorized"}, status_code=401)

    check = bearer_checker(cfg, denied)

    async def models(request: Request) -> Response:
        stats.model_lists += 1
        if (refused := check(request)) is not None:
            return refused
        card = {"id": name, "object": "model", "created": stats.created, "owned_by": "vllm", "root": name,
                "parent": None, "max_model_len": MAX_MODEL_LEN,
                "permission": [{"id": "modelperm-" + uuid.uuid4().hex, "object": "model_permission",
                                "created": stats.created, "allow_create_engine": False, "allow_sampling": True,
                                "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                                "allow_fine_tuning": False, "organization": "*", "group": None,
                                "is_blocking": False}]}
        return JSONResponse({"object": "list", "data": [card]})

    async def version(request: Request) -> Response:
        return JSONResponse({"version": VERSIONS.get(cfg.flavour, VERSIONS[""])})

    return [
        Route("/v1/chat/completions", inference(cfg, stats, _handler(True)), methods=["POST"]),
        Route("/v1/completions", inference(cfg, stats, _handler(False), scenarios.from_prompt), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        # vLLM's own Responses and Anthropic Messages routes (what `passthrough` sends to, docs/vllm.md)
        *responses_api.api_routes(cfg, stats, lambda status: error_plan(cfg.flavour, status)),
        *anthropic_api.api_routes(cfg, stats, "/v1/messages", lambda model: None, auth="bearer"),
        *retrieval.openai_routes(name, check),  # a pooling model's /v1/embeddings, a reranker's /v1/rerank
    ]
