"""The inference endpoint of one client dialect (proxy/clients): its HTTP transport (`__call__`, a raw ASGI callable)
and `serve`, which any transport calls with a request and a sink (proxy/endpoint/exchange.py; the Responses
WebSocket mode: proxy/server/responses_socket.py). `serve_http` and `HttpInbound` are the HTTP transport of every
endpoint (the retrieval endpoints' too: proxy/endpoint/retrieval.py).

The HTTP endpoints are raw ASGI callables (not Starlette Request/Response) because they own two things the
framework does not do for us:
- cancellation: the disconnect watch (proxy/endpoint/request.py `Disconnect`) cancels the request's task when the
  client goes away, so the upstream request is closed at once — while waiting for response headers, while reading a
  non-stream body, and mid-stream;
- the stream relay: upstream bytes -> pipeline -> hub events -> client encoder -> bytes, reading upstream only as
  fast as the client takes it (the front end's `send` waits while the socket's write buffer is full).
"""

from __future__ import annotations

import os
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Final

from proxy.endpoint.exchange import Exchange
from proxy.endpoint.passthrough import Passthrough
from proxy.endpoint.record import AccessRecord
from proxy.endpoint.request import (
    Disconnect,
    Scope,
    parse_body,
    read_request_body,
    scan_headers,
    take_request_id,
)
from proxy.endpoint.sink import HttpSink
from proxy.endpoint.translate import Translation
from proxy.hub.canonical import RequestContext

if TYPE_CHECKING:
    from proxy.clients.base import ClientCall, ClientDialect
    from proxy.endpoint.exchange import Endpoint, Inbound
    from proxy.endpoint.passthrough import NativeCall
    from proxy.endpoint.sink import Envelope, Sink
    from proxy.server.appstate import AppState

# Functions of other modules called per request, as statics (compiled: no module attribute looked up per call)
_clock: Final = time.perf_counter
_wall_clock: Final = time.time

CHAT_MODELS: Final = "chat"  # the kind of model (proxy/gateway/routing.py) every client dialect here asks for
KEY_NAME_SCOPE: Final = "dialect_proxy.key_name"  # set by proxy.server.asgi.ProxyApp: the name of the inbound key used


class InferenceEndpoint:
    """POST on a client dialect's path (proxy/clients): /v1/chat/completions, /v1/completions, /v1/responses ..."""

    def __init__(self, state: AppState, client: ClientDialect[Any]) -> None:
        self.state = state
        self.client = client
        self.route = client.path
        self.translation = Translation(state, client)
        # Native passthrough (proxy/endpoint/passthrough.py): None unless an upstream takes this client dialect as it
        # is.
        self.native = Passthrough.create(state, client)

    def __call__(self, scope: Scope, receive: Any, send: Any) -> Coroutine[Any, Any, int]:
        """The HTTP transport: the request's body from `receive`, its answer through `send` (`serve_http`'s own
        coroutine, not one more awaiting it)."""
        return serve_http(self, self.client, scope, receive, send)

    async def serve(self, inbound: Inbound, sink: Sink, record: AccessRecord, started: float) -> int:
        """One request of this client dialect, from any transport (`started`: its time.perf_counter()): the status
        the client got."""
        return await Exchange(self, sink, record, started, inbound.headers).run(inbound)

    async def answer(self, exchange: Exchange, inbound: Inbound, request: dict[str, Any], raw: bytes | None) -> int:
        """Pass the request through when its upstream takes it as it is, else decode and translate it."""
        native = self.native
        passed = None if native is None else native.call(request, raw, inbound.headers)
        if passed is not None:
            assert native is not None
            ctx = await exchange.routed(request, self.context(passed, exchange.record.request_id), inbound)
            return await native.serve(passed, ctx, exchange)
        call = await self.client.decode(request)
        ctx = await exchange.routed(call.request, self.context(call, exchange.record.request_id), inbound)
        return await self.translation.serve(call, ctx, exchange)

    def context(self, call: ClientCall | NativeCall, request_id: str) -> RequestContext:
        """The routed call's context: its upstream, and the response's id and time."""
        route = self.state.router.resolve_kind(call.model, CHAT_MODELS)  # a chat request, whatever its dialect
        return RequestContext(
            kind=call.kind,
            request_id=request_id,
            client_model=call.model,
            upstream_model=route.upstream_model,
            upstream=route.upstream,
            stream=call.stream,
            # 12 random bytes in hex: secrets.token_hex(12) is exactly this, through three interpreted calls
            # (secrets.token_bytes, SystemRandom.randbytes) that a request would pay for nothing (docs/speed.md).
            response_id=self.client.id_prefix + os.urandom(12).hex(),
            created=int(_wall_clock()),
        )


async def serve_http(endpoint: Endpoint, envelope: Envelope, scope: Scope, receive: Any, send: Any) -> int:
    """One HTTP request to `endpoint`: its body from `receive`, its answer through `send`, an error before the answer
    in `envelope`'s dialect. The status the client got."""
    started = _clock()
    rid_raw, length = scan_headers(scope["headers"])
    request_id, rid_bytes = take_request_id(rid_raw)
    record = AccessRecord(request_id, endpoint.route, scope.get(KEY_NAME_SCOPE))
    sink = HttpSink(send, envelope, [(b"x-request-id", rid_bytes)])
    inbound = HttpInbound(scope, receive, length, endpoint.state.settings.server.max_body_bytes)
    return await Exchange(endpoint, sink, record, started, inbound.headers).run(inbound)


class HttpInbound:
    """An HTTP request: its body read from ASGI `receive` (`length`: its content-length header), at most `limit`
    bytes."""

    __slots__ = ("headers", "length", "limit", "receive", "scope")

    def __init__(self, scope: Scope, receive: Any, length: bytes, limit: int) -> None:
        self.scope = scope
        self.headers = scope["headers"]
        self.receive = receive
        self.length = length
        self.limit = limit

    def read(self) -> Coroutine[Any, Any, bytes | None]:
        return read_request_body(self.length, self.receive, self.limit)

    def parse(self, raw: bytes | None) -> dict[str, Any]:
        return parse_body(raw or b"")

    def watch(self) -> Disconnect:
        return Disconnect(self.receive, self.scope)
