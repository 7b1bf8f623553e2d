"""Capture what Claude Code sends: a loopback server that records every request (JSON body and headers, secrets
stripped) and answers /v1/messages with hand-written Anthropic SSE (independent of proxy/clients/messages.py).

    python tests/cli/record_claude_code.py OUT_DIR [PORT]

The first /v1/messages call that offers a `Bash` tool is answered with a `thinking` block and a `tool_use` (Bash:
`echo recorded`); every other call with a short text. Run `claude -p` against it (see tests/cli/test_claude_code.py
for the environment).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

SECRET_HEADERS = {"x-api-key", "authorization", "cookie"}


def _sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def _answer(model: str, blocks: list[dict[str, Any]], stop: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [{"type": "message_start", "message": {
        "id": "msg_rec", "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 1}}}]
    for i, block in enumerate(blocks):
        if block["type"] == "thinking":
            events.append({"type": "content_block_start", "index": i,
                           "content_block": {"type": "thinking", "thinking": "", "signature": ""}})
            events.append({"type": "content_block_delta", "index": i,
                           "delta": {"type": "thinking_delta", "thinking": block["thinking"]}})
            events.append({"type": "content_block_delta", "index": i,
                           "delta": {"type": "signature_delta", "signature": block["signature"]}})
        elif block["type"] == "text":
            events.append({"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}})
            events.append({"type": "content_block_delta", "index": i,
                           "delta": {"type": "text_delta", "text": block["text"]}})
        else:
            events.append({"type": "content_block_start", "index": i, "content_block": {**block, "input": {}}})
            events.append({"type": "content_block_delta", "index": i,
                           "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}})
        events.append({"type": "content_block_stop", "index": i})
    events.append({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                   "usage": {"output_tokens": 5}})
    events.append({"type": "message_stop"})
    return events


def create_app(out: Path) -> Starlette:
    state = {"n": 0, "tool_sent": False}

    async def record(request: Request) -> Response:
        state["n"] += 1
        raw = await request.body()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        headers = {k: ("<redacted>" if k in SECRET_HEADERS else v) for k, v in request.headers.items()}
        record = {"method": request.method, "path": request.url.path, "query": request.url.query,
                  "headers": headers, "body": body}
        (out / f"{state['n']:03d}.json").write_text(json.dumps(record, indent=1))
        if request.url.path == "/v1/messages/count_tokens":
            return JSONResponse({"input_tokens": 100})
        if request.url.path != "/v1/messages" or not isinstance(body, dict):
            return JSONResponse({"type": "error", "error": {"type": "not_found_error", "message": "no"}}, 404)
        model = body.get("model", "m")
        tools = {t.get("name") for t in body.get("tools") or []}
        if "Bash" in tools and not state["tool_sent"]:
            state["tool_sent"] = True
            blocks = [{"type": "thinking", "thinking": "The user wants echo.", "signature": "c2lnbmF0dXJl"},
                      {"type": "text", "text": "Running it."},
                      {"type": "tool_use", "id": "toolu_rec1", "name": "Bash",
                       "input": {"command": "echo recorded", "description": "Print a word"}}]
            stop = "tool_use"
        else:
            blocks = [{"type": "text", "text": "Done: recorded."}]
            stop = "end_turn"
        events = _answer(model, blocks, stop)
        if not body.get("stream"):
            msg = dict(events[0]["message"], content=blocks, stop_reason=stop)
            return JSONResponse(msg)
        return StreamingResponse(iter([_sse(events)]), media_type="text/event-stream")

    return Starlette(routes=[Route("/{path:path}", record, methods=["GET", "POST", "HEAD", "PUT", "DELETE"])])


if __name__ == "__main__":
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 8765
    uvicorn.run(create_app(out_dir), host="127.0.0.1", port=port, log_level="warning")
