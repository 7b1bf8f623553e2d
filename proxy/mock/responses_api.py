"""The OpenAI Responses API as a mock upstream serves it natively (`POST /v1/responses`, `POST
/v1/responses/compact`): for the proxy's native passthrough (docs/passthrough.md), mounted by the OpenAI flavour.
Written from OpenAI's API reference ("Create a model response", "Streaming events", "Compact a response"), minimal
but real:

* a response object (`resp_…`) with `output` (a `message` item with one `output_text` part), `usage` (`input_tokens`,
  `input_tokens_details.cached_tokens`, `output_tokens`, `output_tokens_details.reasoning_tokens`, `total_tokens`)
  and the request's settings echoed (`instructions`, `tools`, `store`, `previous_response_id`, `metadata` ...);
* hosted tools: a request offering `web_search` gets a completed `web_search_call` item before the message;
* `store` (default true) keeps the response's id: a later `previous_response_id` must name one (else 400
  `previous_response_not_found`, param `previous_response_id`), and `GET /v1/responses/{id}` returns it;
* `background: true` answers at once with a `queued` response and no output;
* streams: `response.created`, `response.in_progress`, per item `response.output_item.added` ... `.done` (the
  message's `response.content_part.added`, `response.output_text.delta` per token, `response.output_text.done`,
  `response.content_part.done`), then `response.completed`; every event has `event:` and a `sequence_number`;
* directives as in the other flavours (`error=STATUS`, `drop_before`, `drop=N`, `stall=N`, `delay_ms` ...) from the
  last user input, and `[mock:cached=N]`: that many input tokens reported as cached;
* `/v1/responses/compact`: `{"object": "response.compaction", "output": [the user messages..., a `compaction`
  item with `encrypted_content`], "usage"}`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.mock.asgi import Plan, Stats, json_plan, stream_plan
from proxy.mock.common import Call, MockConfig, inference, int_param, openai_error, preamble, stream_directives
from proxy.mock.scenario import EMPTY, Scenario, content_text, parse
from proxy.mock.textgen import Generation, generate, prompt_tokens_text

SSE = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
_HOSTED = frozenset({"web_search", "web_search_preview", "file_search", "code_interpreter", "image_generation"})


def _ident(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def input_text(body: Any) -> str:
    """The text of the last user input: `input` itself when a string, else its last user message's text."""
    if not isinstance(body, dict):
        return ""
    items = body.get("input")
    if isinstance(items, str):
        return items
    if isinstance(items, list):
        for item in reversed(items):
            if isinstance(item, dict) and item.get("role") == "user":
                return content_text(item.get("content"))
    return ""


def scenario(body: Any) -> Scenario:
    text = input_text(body)
    return parse(text) if text else EMPTY


def _prompt_tokens(body: dict[str, Any]) -> int:
    items = body.get("input")
    text = items if isinstance(items, str) else orjson.dumps(items).decode() if items is not None else ""
    return prompt_tokens_text(str(body.get("instructions") or "") + text)


def _usage(body: dict[str, Any], gen: Generation | None, sc: Scenario) -> dict[str, Any]:
    prompt = _prompt_tokens(body)
    output = gen.completion_tokens if gen is not None else 0
    cached = min(sc.num("cached", 0, lo=0) or 0, prompt)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + output}


class _Responses:
    """One server's responses API (its stored ids live as long as the server)."""

    def __init__(self, cfg: MockConfig, error_plan: Callable[[int], Plan]) -> None:
        self.cfg = cfg
        self.error_plan = error_plan
        self.stored: dict[str, dict[str, Any]] = {}

    @staticmethod
    def _response(call: Call, rid: str, status: str, output: list[dict[str, Any]],
                  usage: dict[str, Any] | None) -> dict[str, Any]:
        body = call.body
        return {"id": rid, "object": "response", "created_at": call.created, "status": status,
                "background": body.get("background") is True, "error": None, "incomplete_details": None,
                "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
                "model": body["model"], "output": output,
                "parallel_tool_calls": body.get("parallel_tool_calls", True),
                "previous_response_id": body.get("previous_response_id"), "reasoning": body.get("reasoning"),
                "store": body.get("store") is not False, "temperature": body.get("temperature", 1.0),
                "text": body.get("text") or {"format": {"type": "text"}},
                "tool_choice": body.get("tool_choice", "auto"),
                "tools": body.get("tools") or [], "top_p": body.get("top_p", 1.0), "truncation": "disabled",
                "usage": usage, "user": body.get("user"), "metadata": body.get("metadata") or {}}

    def _refused(self, call: Call) -> Plan | None:
        """The key, the connection and error directives, then a body without a model: what every route checks."""
        if (plan := preamble(call, self.error_plan)) is not None:
            return plan
        body = call.body
        if not call.json_ok or not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return openai_error(400, "Missing required parameter: 'model'.", "invalid_request_error",
                                "missing_required_parameter", "model")
        return None

    def handle(self, call: Call) -> Plan:
        if (plan := self._refused(call)) is not None:
            return plan
        body = call.body
        previous = body.get("previous_response_id")
        if previous is not None and previous not in self.stored:
            return openai_error(400, f"Previous response with id '{previous}' not found.", "invalid_request_error",
                                "previous_response_not_found", "previous_response_id")
        rid = _ident("resp_")
        sc = call.scenario
        if body.get("background") is True:
            queued = self._response(call, rid, "queued", [], None)
            self.stored[queued["id"]] = queued
            return json_plan(200, queued)
        gen = generate(sc, dialect="openai", max_tokens=int_param(body, "max_output_tokens"))
        text = "".join(p.text for p in gen.pieces if p.kind == "content")
        hosted = [t for t in body.get("tools") or () if isinstance(t, dict) and t.get("type") in _HOSTED]
        search = None
        if any(t.get("type", "").startswith("web_search") for t in hosted):
            search = {"id": _ident("ws_"), "type": "web_search_call", "status": "completed",
                      "action": {"type": "search", "query": input_text(body)[:100]}}
        message = {"id": _ident("msg_"), "type": "message", "status": "completed", "role": "assistant",
                   "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}
        output = ([search] if search else []) + [message]
        usage = _usage(body, gen, sc)
        done = self._response(call, rid, "completed", output, usage)
        if body.get("store") is not False:
            self.stored[done["id"]] = done
        if not call.stream:
            return json_plan(200, done)
        return self._stream(call, done, search, message, gen, sc)

    def _stream(self, call: Call, done: dict[str, Any], search: dict[str, Any] | None, message: dict[str, Any],
                gen: Generation, sc: Scenario) -> Plan:
        seq = iter(range(1_000_000))

        def event(kind: str, **fields: Any) -> bytes:
            payload = {"type": kind, "sequence_number": next(seq), **fields}
            return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

        started = self._response(call, done["id"], "in_progress", [], None)
        head = [event("response.created", response=started), event("response.in_progress", response=started)]
        index = 0
        if search is not None:
            head += [event("response.output_item.added", output_index=0, item={**search, "status": "in_progress"}),
                     event("response.web_search_call.in_progress", output_index=0, item_id=search["id"]),
                     event("response.web_search_call.searching", output_index=0, item_id=search["id"]),
                     event("response.web_search_call.completed", output_index=0, item_id=search["id"]),
                     event("response.output_item.done", output_index=0, item=search)]
            index = 1
        item_id = message["id"]
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        head += [event("response.output_item.added", output_index=index,
                       item={**message, "status": "in_progress", "content": []}),
                 event("response.content_part.added", item_id=item_id, output_index=index, content_index=0,
                       part=part)]
        body = [event("response.output_text.delta", item_id=item_id, output_index=index, content_index=0,
                      delta=p.text, logprobs=[]) for p in gen.pieces if p.kind == "content" and p.text]
        final_part = message["content"][0]
        tail = [event("response.output_text.done", item_id=item_id, output_index=index, content_index=0,
                      text=final_part["text"], logprobs=[]),
                event("response.content_part.done", item_id=item_id, output_index=index, content_index=0,
                      part=final_part),
                event("response.output_item.done", output_index=index, item=message),
                event("response.completed", response=done)]
        return stream_plan(head, body, tail, headers=SSE, **stream_directives(sc))

    def compact(self, call: Call) -> Plan:
        if (plan := self._refused(call)) is not None:
            return plan
        body = call.body
        items = body.get("input")
        users = [item for item in items if isinstance(item, dict) and item.get("role") == "user"] \
            if isinstance(items, list) else [{"role": "user", "content": items}] if isinstance(items, str) else []
        compaction = {"id": _ident("cmp_"), "type": "compaction", "encrypted_content": "mock-" + secrets.token_hex(16)}
        return json_plan(200, {"id": _ident("resp_"), "object": "response.compaction", "created_at": call.created,
                               "output": [*users, compaction], "usage": _usage(body, None, call.scenario)})


def api_routes(cfg: MockConfig, stats: Stats, error_plan: Callable[[int], Plan]) -> list[Route]:
    """The Responses API's routes on a server whose errors `error_plan` renders."""
    api = _Responses(cfg, error_plan)

    async def get(request: Request) -> Response:
        found = api.stored.get(request.path_params["response_id"])
        if found is None:
            return Response(orjson.dumps({"error": {"message": "No response found.", "type": "invalid_request_error",
                                                    "param": None, "code": None}}), 404,
                            media_type="application/json")
        return Response(orjson.dumps(found), media_type="application/json")

    return [
        Route("/v1/responses", inference(cfg, stats, api.handle, scenario), methods=["POST"]),
        Route("/v1/responses/compact", inference(cfg, stats, api.compact, scenario), methods=["POST"]),
        Route("/v1/responses/{response_id}", get, methods=["GET"]),
    ]
