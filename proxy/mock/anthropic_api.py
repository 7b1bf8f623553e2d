"""The Anthropic Messages API as a mock upstream serves it natively: DeepSeek's `/anthropic/v1/messages` (its guide
"Anthropic API"), for the proxy's native passthrough (docs/passthrough.md). Written from Anthropic's Messages
reference and DeepSeek's compatibility table, minimal but real:

* auth: `x-api-key` (when the server has a key; `Authorization: Bearer` where the server checks the key as on its
  other routes, as vLLM's `--api-key`); a wrong or missing one is 401 `authentication_error`;
* a `message` with `content` blocks: a `thinking` block (with a `signature`) when the request enables thinking, then
  one `text` block; `stop_reason` `end_turn` (`max_tokens` when cut), `usage` with `input_tokens`, `output_tokens`,
  `cache_read_input_tokens` and `cache_creation_input_tokens`;
* streams: `message_start` (its usage carries the input tokens), per block `content_block_start`,
  `content_block_delta` per token (`thinking_delta` / `signature_delta` / `text_delta`), `content_block_stop`, a
  `ping`, then `message_delta` (stop reason and output tokens) and `message_stop`; each event with `event:`;
* errors in Anthropic's shape `{"type": "error", "error": {"type", "message"}}` (429 `rate_limit_error`, 529
  `overloaded_error` ...); directives as in the other flavours from the last user message, and `[mock:cached=N]`:
  that many input tokens read from the cache.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import orjson
from starlette.routing import Route

from proxy.mock.asgi import Plan, Stats, json_plan, stream_plan
from proxy.mock.common import Call, MockConfig, connection_directives, inference, requested_status, stream_directives
from proxy.mock.scenario import Scenario, from_chat
from proxy.mock.textgen import Generation, generate, prompt_tokens_chat

SSE = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
          413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}


def error_plan(status: int, message: str | None = None) -> Plan:
    kind = _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    body = {"type": "error", "error": {"type": kind, "message": message or f"Mock error {status}"}}
    headers = [(b"content-type", b"application/json")]
    if status == 429:
        headers.append((b"retry-after", b"7"))
    return json_plan(status, body, headers)


def _usage(call: Call, gen: Generation | None, sc: Scenario) -> dict[str, Any]:
    prompt = prompt_tokens_chat(call.body.get("messages")) + len(str(call.body.get("system") or "").encode()) // 4
    cached = min(sc.num("cached", 0, lo=0) or 0, prompt)
    return {"input_tokens": prompt - cached, "output_tokens": gen.completion_tokens if gen is not None else 0,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def handler(model_check: Callable[[str], str | None], auth: str = "x-api-key") -> Callable[[Call], Plan]:
    """The Messages endpoint; `model_check` names what is wrong with a model name (None: served); `auth` the header
    that carries the key (`bearer`: Authorization with its Bearer scheme)."""

    def handle(call: Call) -> Plan:
        key = call.cfg.api_key
        given = call.headers.get(auth) if auth != "bearer" else call.headers.get("authorization", "")[len("Bearer "):]
        if key is not None and given != key:
            return error_plan(401, "Authentication Fails, Your api key is invalid")
        sc = call.scenario
        if (plan := connection_directives(sc)) is not None:
            return plan
        if (status := requested_status(sc)) is not None:
            return error_plan(status if isinstance(status, int) else 500)
        body = call.body
        if not call.json_ok or not isinstance(body, dict):
            return error_plan(400, "The request body is not valid JSON")
        model = body.get("model")
        max_tokens = body.get("max_tokens")
        if not isinstance(model, str) or not isinstance(body.get("messages"), list):
            return error_plan(400, "`model` and `messages` are required")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            return error_plan(400, "max_tokens: Field required")
        if (problem := model_check(model)) is not None:
            return error_plan(400, problem)
        thinking = isinstance(body.get("thinking"), dict) and body["thinking"].get("type") == "enabled"
        gen = generate(sc, dialect="deepseek", max_tokens=max_tokens, reasoning_field=thinking)
        return (_stream if call.stream else _json)(call, model, gen, thinking, sc)

    return handle


def _blocks(gen: Generation, thinking: bool) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if thinking:
        blocks.append({"type": "thinking", "thinking": gen.reasoning, "signature": secrets.token_hex(16)})
    blocks.append({"type": "text", "text": gen.content})
    return blocks


def _stop(gen: Generation) -> str:
    return "max_tokens" if gen.finish_reason == "length" else "end_turn"


def _json(call: Call, model: str, gen: Generation, thinking: bool, sc: Scenario) -> Plan:
    return json_plan(200, {"id": "msg_" + secrets.token_hex(12), "type": "message", "role": "assistant",
                           "model": model, "content": _blocks(gen, thinking), "stop_reason": _stop(gen),
                           "stop_sequence": None, "usage": _usage(call, gen, sc)})


def _stream(call: Call, model: str, gen: Generation, thinking: bool, sc: Scenario) -> Plan:
    def event(kind: str, **fields: Any) -> bytes:
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **fields}) + b"\n\n"

    usage = _usage(call, gen, sc)
    start: dict[str, Any] = {"id": "msg_" + secrets.token_hex(12), "type": "message", "role": "assistant",
                             "model": model, "content": [], "stop_reason": None, "stop_sequence": None,
                             "usage": {**usage, "output_tokens": 1}}
    head = [event("message_start", message=start)]
    body: list[bytes] = []
    text_index = 0
    if thinking:
        head.append(event("content_block_start", index=0, content_block={"type": "thinking", "thinking": "",
                                                                         "signature": ""}))
        body += [event("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": p.text})
                 for p in gen.pieces if p.kind == "reasoning" and p.text]
        body += [event("content_block_delta", index=0,
                       delta={"type": "signature_delta", "signature": secrets.token_hex(16)}),
                 event("content_block_stop", index=0)]
        text_index = 1
    body.append(event("content_block_start", index=text_index, content_block={"type": "text", "text": ""}))
    body += [event("content_block_delta", index=text_index, delta={"type": "text_delta", "text": p.text})
             for p in gen.pieces if p.kind == "content" and p.text]
    tail = [event("content_block_stop", index=text_index), event("ping"),
            event("message_delta", delta={"stop_reason": _stop(gen), "stop_sequence": None},
                  usage={"output_tokens": usage["output_tokens"]}),
            event("message_stop")]
    return stream_plan(head, body, tail, headers=SSE, **stream_directives(sc))


def api_routes(cfg: MockConfig, stats: Stats, path: str, model_check: Callable[[str], str | None],
               auth: str = "x-api-key") -> list[Route]:
    return [Route(path, inference(cfg, stats, handler(model_check, auth), from_chat), methods=["POST"])]
