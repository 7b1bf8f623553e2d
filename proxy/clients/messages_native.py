"""Reading a Messages answer that an upstream gave natively (native passthrough, proxy/endpoint/passthrough.py):
Anthropic's stream events and message object, read for metrics only."""

from __future__ import annotations

from typing import Any, Final

from proxy.clients.native import NativeReader

# Anthropic's stop reasons as the finish reasons the metrics count (`pause_turn` and others: as they are).
_STOP: Final = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
                "refusal": "content_filter", "model_context_window_exceeded": "length"}


class MessagesReader(NativeReader):
    __slots__ = ("_usage",)

    def __init__(self) -> None:
        super().__init__()
        self._usage: dict[str, Any] = {}  # Anthropic's usage so far: message_start's, updated by message_delta's

    def event(self, payload: dict[str, Any]) -> bool:
        kind = payload.get("type")
        if kind == "content_block_delta":
            return True
        if kind == "message_start":
            message = payload.get("message")
            if isinstance(message, dict):
                self._add_usage(message.get("usage"))
        elif kind == "message_delta":
            self._add_usage(payload.get("usage"))
            delta = payload.get("delta")
            if isinstance(delta, dict):
                self._stop(delta.get("stop_reason"))
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            self.done = True
            error = payload.get("error")
            code = error.get("type") if isinstance(error, dict) else None
            self.error = code if isinstance(code, str) and code else "error"
        return False

    def read_body(self, payload: dict[str, Any]) -> None:
        self._add_usage(payload.get("usage"))
        self._stop(payload.get("stop_reason"))

    def _stop(self, reason: Any) -> None:
        if isinstance(reason, str):
            self.answer.finish_reason = _STOP.get(reason, reason)

    def _add_usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        self._usage.update((k, v) for k, v in usage.items() if v is not None)
        u = self._usage
        read = _int(u.get("cache_read_input_tokens"))
        prompt = _int(u.get("input_tokens")) + read + _int(u.get("cache_creation_input_tokens"))
        self.answer.usage = {"prompt_tokens": prompt, "completion_tokens": u.get("output_tokens"),
                             "prompt_tokens_details": {"cached_tokens": read}}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
