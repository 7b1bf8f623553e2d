"""The access record: what the access log line (logger `dialect_proxy.access`, one JSON object per request) says
of one request, filled in as the request goes and written out once, at its end (`line`).

The line's keys (docs/observability.md): request_id, route, key (the inbound key's name), trace_id and span_id (a
traced request), upstream, model, stream, dialect, passthrough, the client spoke's note (ignored_tools,
unverified_thinking), replica, queue_ms and retries (the replicas' walk: proxy/gateway/replicas.py Attempts),
prompt_tokens and completion_tokens (tokens_estimated: the proxy counted them; batches: the upstream requests a
retrieval call went as, proxy/endpoint/retrieval.py), finish_reason, error, truncated, status, duration_ms, ttft_ms and
client_disconnected. A key whose value is unknown is left out, except the last four, which every line has.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import orjson

if TYPE_CHECKING:
    from proxy.gateway.replicas import Attempts

_dumps: Final = orjson.dumps


class AccessRecord:
    """One request's access log line, as typed fields."""

    __slots__ = ("attempts", "batches", "client_disconnected", "completion_tokens", "dialect", "error",
                 "finish_reason", "key", "model", "note", "passthrough", "prompt_tokens", "request_id", "route",
                 "span_id", "stream", "tokens_estimated", "trace_id", "truncated", "upstream")

    def __init__(self, request_id: str, route: str, key: str | None) -> None:
        self.request_id = request_id
        self.route = route
        self.key = key  # the name of the inbound API key used (proxy/server/asgi.py)
        self.trace_id: str | None = None
        self.span_id: str | None = None
        self.upstream: str | None = None
        self.model: str | None = None
        self.stream: bool | None = None
        self.dialect: str | None = None  # the upstream spoke's name
        self.passthrough = False
        self.note: tuple[str, str | int] | None = None  # the client spoke's own fact (ClientCall.log_note)
        self.attempts: Attempts | None = None
        self.prompt_tokens: Any = None
        self.completion_tokens: Any = None
        self.tokens_estimated = False  # the upstream did not count the tokens: the proxy did (a retrieval call)
        self.batches: int | None = None  # the upstream requests a retrieval call went as
        self.finish_reason: str | None = None
        self.error: str | None = None  # the error code the request ended with
        self.truncated: str | None = None  # why a stream under way was cut
        self.client_disconnected = False

    def usage(self, usage: dict[str, Any]) -> None:
        self.prompt_tokens = usage.get("prompt_tokens")
        self.completion_tokens = usage.get("completion_tokens")

    def line(self, status: int, duration: float, ttft: float | None) -> str:
        """The JSON log line of the finished request (`duration` and `ttft` in seconds)."""
        out: dict[str, Any] = {"request_id": self.request_id, "route": self.route}
        optional = (("key", self.key), ("trace_id", self.trace_id), ("span_id", self.span_id),
                    ("upstream", self.upstream), ("model", self.model), ("stream", self.stream),
                    ("dialect", self.dialect))
        out.update((name, value) for name, value in optional if value is not None)
        if self.note is not None:
            out[self.note[0]] = self.note[1]
        if self.passthrough:
            out["passthrough"] = True
        self._attempts(out)
        if self.prompt_tokens is not None or self.completion_tokens is not None:
            out["prompt_tokens"] = self.prompt_tokens
            out["completion_tokens"] = self.completion_tokens
        if self.tokens_estimated:
            out["tokens_estimated"] = True
        if self.batches is not None:
            out["batches"] = self.batches
        ending = (("finish_reason", self.finish_reason), ("error", self.error), ("truncated", self.truncated))
        out.update((name, value) for name, value in ending if value is not None)
        out["status"] = status
        out["duration_ms"] = round(duration * 1000, 2)
        out["ttft_ms"] = None if ttft is None else round(ttft * 1000, 2)
        out["client_disconnected"] = self.client_disconnected
        return _dumps(out).decode()

    def _attempts(self, out: dict[str, Any]) -> None:
        attempts = self.attempts
        if attempts is None or not attempts.replica:
            return
        out["replica"] = attempts.replica
        if attempts.queue_ms:
            out["queue_ms"] = attempts.queue_ms
        if attempts.retries:
            out["retries"] = [{"replica": replica, "error": error} for replica, error in attempts.retries]
