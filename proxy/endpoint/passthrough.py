"""Native passthrough: a request in a client dialect that its upstream serves natively goes there untranslated, and
the answer comes back byte for byte (docs/passthrough.md).

An upstream opts in per client dialect (`passthrough: [responses]`, proxy/settings.py), among those its spoke serves
natively (mappings/<name>.yaml `native`, proxy/dialects/base.py `NativeRoute`). Everything around the request is as
for a translated one: the inbound key check (proxy/server/asgi.py), the body limit, shutdown, admission and the
replicas with their retries (proxy/gateway/replicas.py `Attempts.open`: only before the answer's head is accepted,
so before any byte reached the client), the deadlines, metrics, traces and the access log
(proxy/endpoint/exchange.py), and the relay that commits the stream's head, sends keep-alives and ends a cut stream
with an error event (proxy/endpoint/relay.py).

What is different: the body goes as the client sent it (only `model` is replaced by the upstream's name when the
client used an alias); the upstream's key replaces the client's credentials, which are never forwarded; the answer's
bytes are relayed as they arrive, with the client spoke's `NativeReader` reading them on the side for usage, the
finish reason and the first token's time. The upstream's own errors pass as they are (they are in the client's
dialect already); failures of the proxy's own making (unreachable, timeout, queue full) are the client dialect's
errors as for any request, and after a stream began they are the client dialect's error event, sent only at an event
boundary (mid-event, the stream is closed instead). During a silence the stream gets the proxy's SSE keep-alive
comment, also only between events: SSE readers skip comments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import orjson

from proxy.endpoint.relay import Relay
from proxy.endpoint.request import SSE_HEADERS
from proxy.errors import ProxyError, error_type_for
from proxy.gateway.upstream import StreamReads, release
from proxy.hub.canonical import CHAT

if TYPE_CHECKING:
    from proxy.clients.base import ClientDialect, Headers
    from proxy.clients.native import NativeReader
    from proxy.dialects.base import NativeRoute
    from proxy.endpoint.exchange import Exchange
    from proxy.hub.canonical import RequestContext
    from proxy.hub.sse import Event
    from proxy.server.appstate import AppState

# The upstream's response headers that are not passed on: connection-level and framing ones (the proxy's front end
# frames the answer itself; aiohttp has already decoded a compressed body), the upstream's own cookies, and its
# x-request-id (the client gets the proxy's, which the upstream also received).
_NOT_PASSED: Final = frozenset({
    "connection", "keep-alive", "proxy-connection", "transfer-encoding", "content-length", "content-encoding",
    "upgrade", "trailer", "te", "date", "server", "set-cookie", "x-request-id", "alt-svc",
    "strict-transport-security",
})
_EVENT_ENDS: Final = (b"\n\n", b"\r\n\r\n", b"\r\r")


class NativeCall:
    """A request passed through: the body as the client sent it (`raw`: its bytes, None when its transport had it
    parsed), the upstream route that takes it, and the request headers that go with it."""

    __slots__ = ("forwarded", "kind", "model", "raw", "request", "route", "stream")

    def __init__(self, request: dict[str, Any], raw: bytes | None, model: str, route: NativeRoute,
                 forwarded: list[tuple[str, str]]) -> None:
        self.request = request
        self.raw = raw
        self.model = model
        self.stream = request.get("stream") is True
        self.kind = CHAT  # what the routing, the metrics and the trace call the operation
        self.route = route
        self.forwarded = forwarded


class Passthrough:
    """The passthrough of one client dialect: the upstreams that take it natively, by name, with their routes."""

    def __init__(self, state: AppState, client: ClientDialect[Any], routes: dict[str, NativeRoute]) -> None:
        self.state = state
        self.client = client
        self.routes = routes

    @classmethod
    def create(cls, state: AppState, client: ClientDialect[Any]) -> Passthrough | None:
        """None when no upstream passes this client dialect through (the endpoint then never asks)."""
        routes = {u.name: state.dialects[u.name].native_routes()[client.name]
                  for u in state.settings.upstreams if client.name in u.passthrough}
        if not routes or client.native_reader() is None:
            return None
        return cls(state, client, routes)

    def call(self, request: dict[str, Any], raw: bytes | None, headers: Any) -> NativeCall | None:
        """The request as a passed-through call, when its model routes to an upstream that takes it natively; None
        otherwise (the client spoke decodes it: translation, or the error it deserves)."""
        model = request.get("model")
        if not isinstance(model, str) or not model:
            return None
        try:
            route = self.state.router.resolve(model)
        except ProxyError:
            return None
        native = self.routes.get(route.upstream.name)
        if native is None:
            return None
        forwarded = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers
                     if k in self.client.native_headers]
        return NativeCall(request, raw, model, native, forwarded)

    async def serve(self, call: NativeCall, ctx: RequestContext, exchange: Exchange) -> int:
        """Send the request untranslated and relay the answer: the status the client got."""
        state = self.state
        upstream = ctx.upstream
        dialect = state.dialects[upstream.name]
        exchange.record.dialect = dialect.name
        exchange.record.passthrough = True
        payload = call.raw
        if payload is None or ctx.upstream_model != ctx.client_model:  # an alias: the upstream gets its own name
            payload = orjson.dumps({**call.request, "model": ctx.upstream_model})
        deadline = exchange.upstream_started()
        watch, obs = exchange.watch, exchange.obs
        assert watch is not None and obs is not None  # routed
        loop = watch.loop
        attempts = exchange.record.attempts = state.replicas[upstream.name].attempts(call.request)
        ticket, resp = await attempts.open(ctx, call.route.path, payload, _Headers(call, upstream.api_key).for_attempt,
                                           deadline, loop, exchange.trace)
        reusable = False
        try:
            reader = self.client.native_reader()
            assert reader is not None  # create() checked
            if exchange.trace is not None:
                exchange.trace.answering(resp.status, reader.answer)
            obs.upstream_headers()
            answering = _Native(self, exchange, reader, _response_headers(resp.raw_headers))
            status, reusable = await answering.respond(resp, deadline)
            return status
        finally:
            ticket.release()
            if reusable:
                await release(resp)
            else:
                resp.close()


class _Headers:
    """The request headers of each attempt: the client's forwarded ones, our request id, the upstream's key."""

    __slots__ = ("call", "key")

    def __init__(self, call: NativeCall, key: str | None) -> None:
        self.call = call
        self.key = key

    def for_attempt(self, ctx: RequestContext) -> dict[str, str]:
        headers = dict(self.call.forwarded)
        headers["x-request-id"] = ctx.request_id
        key = self.key
        if key:
            auth = self.call.route.auth
            if auth == "bearer":
                headers["Authorization"] = f"Bearer {key}"
            else:
                headers[auth] = key
        return headers


class _Boundary:
    """Where a passed-through stream stands: at an event boundary or inside an event (the last bytes relayed)."""

    __slots__ = ("at", "client", "tail")

    def __init__(self, client: ClientDialect[Any]) -> None:
        self.client = client
        self.tail = b""  # the last bytes relayed: an event boundary when they end an event
        self.at = True

    def passed(self, data: bytes) -> None:
        self.tail = (self.tail + data)[-4:]
        self.at = self.tail.endswith(_EVENT_ENDS)

    def error_event(self, err: ProxyError) -> Event | None:
        """The client dialect's error event, only at an event boundary (mid-event, the stream is closed instead)."""
        return self.client.native_error(err) if self.at else None


class _Native:
    """One passed-through answer on its way to the relay: its bytes as they arrive, read on the side by the client
    spoke's NativeReader (usage, finish reason, first token)."""

    __slots__ = ("boundary", "exchange", "head", "reader", "relay")

    def __init__(self, passthrough: Passthrough, exchange: Exchange, reader: NativeReader, head: Headers) -> None:
        self.exchange = exchange
        self.reader = reader
        self.head = head  # the upstream's headers that the client gets
        self.boundary = _Boundary(passthrough.client)
        names = {name for name, _ in head}
        own = [item for item in SSE_HEADERS if item[0] not in names]
        self.relay = Relay(exchange, [*own, *head], self.boundary.error_event)

    async def respond(self, resp: Any, deadline: float) -> tuple[int, bool]:
        """(the status the client got, whether the upstream connection can serve another request)."""
        if resp.status >= 300 or "text/event-stream" not in resp.headers.get("Content-Type", ""):
            return await self._whole(resp, deadline), True
        status = await self._stream(resp, deadline)
        return status, status == 200

    async def _whole(self, resp: Any, deadline: float) -> int:
        """A body (an answer, or the upstream's own error, in the client's dialect already): as it is."""
        exchange = self.exchange
        raw = await exchange.upstream_body(resp, deadline)
        assert exchange.obs is not None  # routed
        if resp.status >= 300:  # the upstream's own error, in the client's dialect already: as it is
            exchange.record.error = error_type_for(resp.status)[1]
            exchange.obs.upstream_error(exchange.record.dialect or "", str(resp.status))
        else:
            self.reader.body(raw)
            self.relay.usage(self.reader.answer)
        exchange.complete()
        await exchange.sink.start(resp.status, self.head)
        await exchange.sink.native(raw, False)
        return int(resp.status)

    async def _stream(self, resp: Any, deadline: float) -> int:
        """The upstream's event stream, relayed as it arrives. The head goes with the first bytes (or the first
        keep-alive), so a failure before any byte is still an HTTP error in the client's dialect."""
        exchange = self.exchange
        assert exchange.watch is not None
        server = exchange.state.settings.server
        reads = StreamReads(resp, server.idle_timeout, server.keepalive_interval, deadline, exchange.watch.loop)
        try:
            try:
                await self._read(reads)
            finally:
                reads.close()
            return await self._end()
        except ProxyError as err:
            exchange.state.redactor.sanitize(err)
            self.relay.usage(self.reader.answer)
            if not self.relay.committed:
                raise  # nothing reached the client: it gets the HTTP status and its dialect's envelope
            return await self.relay.fail(err)

    async def _read(self, reads: StreamReads) -> None:
        relay = self.relay
        obs = self.exchange.obs
        assert obs is not None
        while True:
            data = await reads.read()
            if data is None:
                if self.boundary.at:
                    await relay.keepalive(None)  # the transport's own (an SSE comment)
                continue
            if not data:
                return
            obs.chunks(1, self.reader.feed(data))
            self.boundary.passed(data)
            await relay.native(data)

    async def _end(self) -> int:
        reader = self.reader
        reader.flush()
        self.relay.usage(reader.answer)
        await self.relay.end([])
        if reader.error is not None or not reader.done:  # the upstream's error event, or an end without one
            reason = "upstream_error" if reader.error is not None else "upstream_closed"
            self.exchange.truncated(reason, reader.error or "upstream_closed")
            return 502
        return 200


def _response_headers(raw: Any) -> list[tuple[bytes, bytes]]:
    """The upstream's response headers that the client gets as they are (content type, rate limits, Retry-After,
    the upstream API's own ...)."""
    return [(k.lower(), v) for k, v in raw if k.lower().decode("latin-1") not in _NOT_PASSED]
