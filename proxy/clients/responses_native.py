"""Reading a Responses answer that an upstream gave natively (native passthrough, proxy/endpoint/passthrough.py): the
stream's events and the response object as OpenAI's Responses API defines them, read for metrics only."""

from __future__ import annotations

from typing import Any, Final

import orjson

from proxy.clients.native import NativeReader
from proxy.errors import ProxyError
from proxy.hub.sse import Event

_TERMINAL: Final = frozenset({"response.completed", "response.incomplete", "response.failed"})
# Output items that are calls the client must answer: the turn ends for a tool call, as Chat's `tool_calls`.
_CALLS: Final = frozenset({"function_call", "custom_tool_call", "local_shell_call", "shell_call", "apply_patch_call",
                           "computer_call"})
_INCOMPLETE: Final = {"max_output_tokens": "length", "content_filter": "content_filter"}


class ResponsesReader(NativeReader):
    __slots__ = ()

    def event(self, payload: dict[str, Any]) -> bool:
        kind = payload.get("type")
        if not isinstance(kind, str):
            return False
        if kind.endswith(".delta"):  # text, reasoning, refusal, call arguments: each a generated piece
            return True
        if kind in _TERMINAL:
            self.done = True
            response = payload.get("response")
            if isinstance(response, dict):
                self.read_body(response)
                if kind == "response.failed":
                    error = response.get("error")
                    code = error.get("code") if isinstance(error, dict) else None
                    self.error = code if isinstance(code, str) and code else "response_failed"
        elif kind == "error":
            self.done = True
            code = payload.get("code")
            self.error = code if isinstance(code, str) and code else "error"
        return False

    def read_body(self, payload: dict[str, Any]) -> None:
        """A response object, or a compaction (`/v1/responses/compact`: output and usage, no status)."""
        usage = payload.get("usage")
        if isinstance(usage, dict):
            self.answer.usage = chat_usage(usage)
        status = payload.get("status")
        output = payload.get("output")
        calls = isinstance(output, list) and any(isinstance(i, dict) and i.get("type") in _CALLS for i in output)
        if status == "completed" or (status is None and isinstance(output, list)):
            self.answer.finish_reason = "tool_calls" if calls else "stop"
        elif status == "incomplete":
            details = payload.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, dict) else None
            self.answer.finish_reason = _INCOMPLETE.get(reason) if isinstance(reason, str) else None


def chat_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """Responses usage (input/output tokens and their details) in the OpenAI Chat shape the metrics read."""
    out: dict[str, Any] = {"prompt_tokens": usage.get("input_tokens"),
                           "completion_tokens": usage.get("output_tokens"),
                           "total_tokens": usage.get("total_tokens")}
    details = usage.get("input_tokens_details")
    if isinstance(details, dict):
        out["prompt_tokens_details"] = {"cached_tokens": details.get("cached_tokens")}
    details = usage.get("output_tokens_details")
    if isinstance(details, dict):
        out["completion_tokens_details"] = {"reasoning_tokens": details.get("reasoning_tokens")}
    return out


def stream_error(err: ProxyError) -> Event:
    """An `error` event (the Responses stream's own) that also carries the error envelope, so that the OpenAI SDKs
    raise it as they raise an error in any stream."""
    payload = {"type": "error", "code": err.code, "message": err.message, "param": err.param, **err.envelope()}
    return Event(b"error", orjson.dumps(payload))
