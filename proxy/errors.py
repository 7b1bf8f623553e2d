"""Errors, and their one wire shape: the OpenAI error envelope.

    ProxyError                    status, type, code, message; `envelope()` / `to_response_bytes()`
     ├── ClientRequestError       the client's request is wrong (400, 404, 413); never retried
     ├── UpstreamError            the upstream answered with an error (any dialect's shape), or garbage
     │    ├── StreamTruncated     the upstream failed after the 200 was committed (sent as an SSE error event)
     │    └── MalformedUpstream   the upstream's JSON lacks a shape the translation relies on (names the field)
     ├── UpstreamUnreachable      refused, reset, DNS: 502
     └── UpstreamTimeout          connect / first byte / idle / total deadline: 504

Status, type and code follow the table in README.md ("Errors"). The upstream's own message is kept; our words go
after it. Nothing here ever includes a stack trace or a credential.
"""

from __future__ import annotations

import orjson

# status -> (type, default code)
ERROR_TYPES: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "invalid_parameter"),
    401: ("authentication_error", "invalid_api_key"),
    402: ("insufficient_quota", "insufficient_quota"),
    403: ("permission_error", "permission_denied"),
    404: ("not_found_error", "model_not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    408: ("timeout_error", "request_timeout"),
    409: ("invalid_request_error", "conflict"),
    413: ("invalid_request_error", "request_too_large"),
    422: ("invalid_request_error", "invalid_parameter"),
    429: ("rate_limit_error", "rate_limited"),
    500: ("upstream_error", "bad_gateway"),
    502: ("upstream_error", "bad_gateway"),
    503: ("service_unavailable", "upstream_unavailable"),
    504: ("timeout_error", "upstream_timeout"),
}

# 4xx statuses the openai SDK (and others) may retry; every other 4xx says x-should-retry: false.
_RETRYABLE_4XX = frozenset({408, 409, 429})


def error_type_for(status: int) -> tuple[str, str]:
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    if 400 <= status < 500:
        return ("invalid_request_error", "invalid_request")
    return ("upstream_error", "bad_gateway")


class ProxyError(Exception):
    status: int = 500
    # The id of the request it answers (its `x-request-id`), set where the error reaches the client: Anthropic's error
    # body carries it (proxy/clients/messages_errors.py).
    request_id: str | None = None

    def __init__(
        self,
        message: str,
        status: int | None = None,
        *,
        type: str | None = None,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        upstream_code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        default_type, default_code = error_type_for(self.status)
        self.type = type or default_type
        self.code = code or default_code
        self.param = param
        self.headers = dict(headers or {})
        # The dialect's own error code (MindIE status, Siliconstorm 701, ...) for the upstream-errors metric.
        self.upstream_code = upstream_code

    def envelope(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def body(self) -> bytes:
        return orjson.dumps(self.envelope())

    def response_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if 400 <= self.status < 500 and self.status not in _RETRYABLE_4XX:
            headers["x-should-retry"] = "false"
        return headers


class ClientRequestError(ProxyError):
    status = 400


class UpstreamError(ProxyError):
    status = 502


class StreamTruncated(UpstreamError):
    """A failure after the 200 was committed; `reason` is one of a small fixed set (a metrics label)."""

    def __init__(self, message: str, reason: str = "upstream_error", **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.reason = reason


class MalformedUpstream(UpstreamError):
    """Upstream JSON of a shape the translation relies on but did not get (a `choices` that is not a list, a `delta`
    that is not an object ...): the upstream's fault, a 502 that names the field. Raised where the shape is read
    (the upstream sessions, the normaliser); mid-stream proxy/hub/pipeline.py turns it into an `invalid_data`
    truncation. Any other exception there is a bug of ours: a 500 `internal_error` (docs/behaviour.md "Errors")."""

    def __init__(self, field: str, expected: str) -> None:
        super().__init__(f"The upstream sent JSON of an unexpected shape: `{field}` is not {expected}.", 502)
        self.field = field


class UpstreamUnreachable(ProxyError):
    status = 502


class UpstreamTimeout(ProxyError):
    status = 504
