"""Errors in the Anthropic shape: `{"type": "error", "error": {"type": ..., "message": ...}}` with Anthropic's
statuses (docs/decisions.md "Client dialects and state": an overloaded upstream, 503, is 529 `overloaded_error`;
502 and 504 stay, as `api_error`). The same body is the in-stream `event: error` after the stream head."""

from __future__ import annotations

from typing import Any, Final

import orjson

from proxy.clients.base import Headers
from proxy.errors import ProxyError
from proxy.hub.sse import Event

_TYPES: Final = {401: "authentication_error", 402: "billing_error", 403: "permission_error", 404: "not_found_error",
                 413: "request_too_large", 429: "rate_limit_error"}


def error_status(err: ProxyError) -> tuple[int, str]:
    """Anthropic's status and error type for a proxy error (docs/decisions.md "Client dialects and state")."""
    status = err.status
    if status == 503:
        if err.code == "state_store_unavailable":
            return 503, "api_error"
        return 529, "overloaded_error"
    if status in _TYPES:
        return status, _TYPES[status]
    if 400 <= status < 500:
        return status, "invalid_request_error"
    return status, "api_error"


def error_body(err: ProxyError, request_id: str | None = None) -> dict[str, Any]:
    """`request_id` is required (nullable) in Anthropic's ErrorResponse: the request's `x-request-id` (`request_id`,
    else the error's own), null only where the request has none."""
    return {"type": "error", "error": {"type": error_status(err)[1], "message": err.message},
            "request_id": request_id or err.request_id}


def error_event(err: ProxyError, request_id: str | None = None) -> Event:
    """The `error` event that ends an Anthropic stream already under way."""
    return Event(b"error", orjson.dumps(error_body(err, request_id)))


def error_response(err: ProxyError) -> tuple[int, Headers, bytes]:
    status, _ = error_status(err)
    headers: Headers = [(k.lower().encode(), v.encode("latin-1", "replace")) for k, v in err.response_headers().items()]
    return status, headers, orjson.dumps(error_body(err))
