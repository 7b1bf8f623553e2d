"""Where an answer goes: the transport's side of an exchange (proxy/endpoint/exchange.py). The endpoint hands a sink
what the client dialect made — a stream's events, one JSON object, an error — and only the sink frames it for its
transport:

    HttpSink       an HTTP response: the head, then an event stream (SSE: `event: <name>` when the event has one,
                   `data: <payload>`, a blank line; a silence's keep-alive is an SSE comment unless the client
                   dialect has an event for it) or one JSON body; an error before the head is the client dialect's
                   error response
    SocketSink     a WebSocket (proxy/server/responses_socket.py): each event's payload one text message; an error
                   before the answer began is the socket's `error` message

The client dialect's encoder emits events (proxy/hub/sse.py `Event`: a name and a JSON payload), the same for every
transport (proxy/clients/base.py `Encoder`).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from proxy.endpoint.request import send_json
from proxy.hub.sse import KEEPALIVE, encode_events

if TYPE_CHECKING:
    from proxy.clients.base import Headers
    from proxy.errors import ProxyError
    from proxy.gateway.limits import LimitView
    from proxy.hub.sse import Event


class Envelope(Protocol):
    """The dialect an error before the answer is told in: a client dialect (proxy/clients/base.py `ClientDialect`),
    or the retrieval endpoints' OpenAI envelope (proxy/endpoint/retrieval.py)."""

    def error_response(self, err: ProxyError) -> tuple[int, Headers, bytes]:
        """The error's status, headers and body."""

    def rate_limit_headers(self, view: LimitView) -> Headers:
        """The headers that tell a limited key's client its limits (proxy/clients/ratelimit.py)."""


class Sink(Protocol):
    async def start(self, status: int, headers: Headers) -> None:
        """The answer's head: an HTTP status and headers (a WebSocket has none to send)."""

    async def events(self, events: list[Event], more: bool) -> None:
        """The client dialect's events, after `start` (`more`: the answer goes on)."""

    async def native(self, data: bytes, more: bool) -> None:
        """The upstream's own bytes of a passed-through answer (proxy/endpoint/passthrough.py), after `start`."""

    async def keepalive(self, pending: list[Event], event: Event | None) -> None:
        """A silence of the upstream, after `start`: the events that were `pending`, then the client dialect's
        keep-alive `event` (Anthropic's ping; None: the transport's own, if it has one)."""

    async def whole(self, body: bytes, headers: Headers) -> None:
        """A whole answer: one JSON object (a non-stream request), status 200."""

    async def refuse(self, err: ProxyError, headers: Headers) -> int:
        """An error before the answer began: the client dialect's error; the status the client got."""

    def limits(self, view: LimitView) -> None:
        """The key's limits, told on the answer to come, whatever it is (a WebSocket has no headers to tell them)."""


class HttpSink:
    """An HTTP response through ASGI `send`; `client`: the dialect of its errors; `extra`: headers every answer
    carries (x-request-id)."""

    __slots__ = ("client", "extra", "send")

    def __init__(self, send: Any, client: Envelope, extra: Headers) -> None:
        self.send = send
        self.client = client
        self.extra = extra

    async def start(self, status: int, headers: Headers) -> None:
        await self.send({"type": "http.response.start", "status": status, "headers": headers + self.extra})

    async def events(self, events: list[Event], more: bool) -> None:
        await self.send({"type": "http.response.body", "body": encode_events(events), "more_body": more})

    async def native(self, data: bytes, more: bool) -> None:
        await self.send({"type": "http.response.body", "body": data, "more_body": more})

    async def keepalive(self, pending: list[Event], event: Event | None) -> None:
        if event is None:
            body = encode_events(pending) + KEEPALIVE  # an SSE comment, which every SSE reader skips
        else:
            pending.append(event)
            body = encode_events(pending)
        await self.send({"type": "http.response.body", "body": body, "more_body": True})

    def whole(self, body: bytes, headers: Headers) -> Coroutine[Any, Any, None]:
        return send_json(self.send, 200, body, headers + self.extra)

    def limits(self, view: LimitView) -> None:
        self.extra = self.extra + self.client.rate_limit_headers(view)

    async def refuse(self, err: ProxyError, headers: Headers) -> int:
        status, own, body = self.client.error_response(err)
        await send_json(self.send, status, body, own + headers + self.extra)
        return status
