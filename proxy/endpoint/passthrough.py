"""Native passthrough: a request in a client dialect that its upstream serves natively goes there untranslated, and
the answer comes back byte for byte (docs/passthrough.md).

An upstream opts in per client dialect (`passthrough: [responses]`, proxy/settings.py), among those its spoke serves
natively (mappings/<name>.yaml `native`, proxy/dialects/base.py `NativeRoute`). Everything around the request is as
for a translated one: the inbound key check (proxy/server/asgi.py), the body limit, shutdown, admission and the
replicas with their retries (proxy/gateway/replicas.py `Attempts.open`: only before the answer's head is accepted,
so before any byte reached the client), the deadlines, metrics, traces and the access log (proxy/endpoint/inference.py
`InferenceEndpoint`).

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

from proxy.endpoint.request import SSE_HEADERS
from proxy.errors import ProxyError, StreamTruncated, error_type_for
from proxy.gateway.upstream import StreamReads, read_body, release
from proxy.hub.canonical import CHAT
from proxy.hub.sse import KEEPALIVE

if TYPE_CHECKING:
    from proxy.clients.base import ClientCall, ClientDialect
    from proxy.clients.native import NativeReader
    from proxy.dialects.base import NativeRoute
    from proxy.hub.canonical import RequestContext
    from proxy.metrics.observer import RequestObserver
    from proxy.metrics.tracing import RequestTrace
    from proxy.server.appstate import AppState

NATIVE: Final = "native"  # ClientCall.options key of a passed-through request: its NativeRoute
# The upstream's response headers that are not passed on: connection-level and framing ones (the proxy's front end
# frames the answer itself; aiohttp has already decoded a compressed body), the upstream's own cookies, and its
# x-request-id (the client gets the proxy's, which the upstream also received).
_NOT_PASSED: Final = frozenset({
    "connection", "keep-alive", "proxy-connection", "transfer-encoding", "content-length", "content-encoding",
    "upgrade", "trailer", "te", "date", "server", "set-cookie", "x-request-id", "alt-svc",
    "strict-transport-security",
})
_EVENT_ENDS: Final = (b"\n\n", b"\r\n\r\n", b"\r\r")


class Passthrough:
    """The passthrough of one client dialect: the upstreams that take it natively, by name, with their routes."""

    def __init__(self, state: AppState, client: ClientDialect, routes: dict[str, NativeRoute]) -> None:
        self.state = state
        self.client = client
        self.routes = routes

    @classmethod
    def create(cls, state: AppState, client: ClientDialect) -> Passthrough | None:
        """None when no upstream passes this client dialect through (the endpoint then never asks)."""
        routes = {u.name: state.dialects[u.name].native_routes()[client.name]
                  for u in state.settings.upstreams if client.name in u.passthrough}
        if not routes or client.native_reader() is None:
            return None
        return cls(state, client, routes)

    def call(self, request: dict[str, Any], raw: bytes, headers: Any) -> ClientCall | None:
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
        options: dict[str, Any] = {NATIVE: native, "raw": raw, "headers": forwarded}
        from proxy.clients.base import (
            ClientCall,  # here: the client spokes import the endpoint, which imports this module
        )

        return ClientCall(request, CHAT, model, request.get("stream") is True, options)

    async def serve(self, call: ClientCall, ctx: RequestContext, send: Any, watch: Any, obs: RequestObserver,
                    rid_header: tuple[bytes, bytes], info: dict[str, Any], trace: RequestTrace | None) -> int:
        """Send the request untranslated and relay the answer: the status the client got."""
        state = self.state
        server = state.settings.server
        upstream = ctx.upstream
        dialect = state.dialects[upstream.name]
        route: NativeRoute = call.options[NATIVE]
        info["dialect"] = dialect.name
        info["passthrough"] = True
        payload: bytes = call.options["raw"]
        if ctx.upstream_model != ctx.client_model:  # an alias: the upstream gets its own name for the model
            payload = orjson.dumps({**call.request, "model": ctx.upstream_model})
        forwarded: list[tuple[str, str]] = call.options["headers"]
        key = upstream.api_key

        def headers_for(ctx: RequestContext) -> dict[str, str]:
            headers = dict(forwarded)
            headers["x-request-id"] = ctx.request_id
            if key:
                if route.auth == "bearer":
                    headers["Authorization"] = f"Bearer {key}"
                else:
                    headers[route.auth] = key
            return headers

        loop = watch.loop
        deadline = loop.time() + server.total_timeout
        obs.upstream_started()
        attempts = state.replicas[upstream.name].attempts(call.request, info)
        ticket, resp = await attempts.open(ctx, route.path, payload, headers_for, deadline, loop, trace)
        reusable = False
        try:
            reader = self.client.native_reader()
            assert reader is not None  # create() checked
            if trace is not None:
                trace.answering(resp.status, reader.answer)
            obs.upstream_headers()
            head = _response_headers(resp.raw_headers) + [rid_header]
            content_type = resp.headers.get("Content-Type", "")
            if resp.status >= 300 or "text/event-stream" not in content_type:
                t_up = loop.time()
                raw = await read_body(resp, max(deadline - loop.time(), 0.001), idle=server.idle_timeout, loop=loop)
                obs.add_upstream_wait(loop.time() - t_up)
                if resp.status >= 300:  # the upstream's own error, in the client's dialect already: as it is
                    code = error_type_for(resp.status)[1]
                    info["error"] = code
                    obs.upstream_error(dialect.name, str(resp.status))
                else:
                    reader.body(raw)
                    _observe(obs, reader, info)
                watch.complete = True
                await send({"type": "http.response.start", "status": resp.status, "headers": head})
                await send({"type": "http.response.body", "body": raw})
                reusable = True
                return resp.status
            status = await self._relay(resp, reader, send, watch, obs, head, info, deadline)
            reusable = status == 200
            return status
        finally:
            ticket.release()
            if reusable:
                await release(resp)
            else:
                resp.close()

    async def _relay(self, resp: Any, reader: NativeReader, send: Any, watch: Any, obs: RequestObserver,
                     head: list[tuple[bytes, bytes]], info: dict[str, Any], deadline: float) -> int:
        """The upstream's event stream, relayed as it arrives. The head goes with the first bytes (or the first
        keep-alive), so a failure before any byte is still an HTTP error in the client's dialect."""
        server = self.state.settings.server
        tail = b""  # the last bytes relayed: an event boundary when they end an event
        boundary = True

        async def out(body: bytes, more: bool = True) -> None:
            if not watch.committed:
                names = {name for name, _ in head}
                own = [item for item in SSE_HEADERS if item[0] not in names]
                await send({"type": "http.response.start", "status": 200, "headers": [*own, *head]})
                watch.committed = True
            await send({"type": "http.response.body", "body": body, "more_body": more})

        reads = StreamReads(resp, server.idle_timeout, server.keepalive_interval, deadline, watch.loop)
        try:
            try:
                while True:
                    data = await reads.read()
                    if data is None:
                        if boundary:
                            await out(KEEPALIVE)
                        continue
                    if not data:
                        break
                    tokens = reader.feed(data)
                    obs.chunks(1, tokens)
                    tail = (tail + data)[-4:]
                    boundary = tail.endswith(_EVENT_ENDS)
                    await out(data)
            finally:
                reads.close()
            reader.flush()
            _observe(obs, reader, info)
            watch.complete = True
            await out(b"", more=False)
            if reader.error is not None or not reader.done:  # the upstream's error event, or an end without one
                reason = "upstream_error" if reader.error is not None else "upstream_closed"
                obs.truncated(reason)
                info["error"] = reader.error or "upstream_closed"
                info["truncated"] = reason
                return 502
            return 200
        except ProxyError as err:
            self.state.redactor.sanitize(err)
            _observe(obs, reader, info)
            if not watch.committed:
                raise  # nothing reached the client: it gets the HTTP status and its dialect's envelope
            reason = err.reason if isinstance(err, StreamTruncated) else "upstream_error"
            obs.truncated(reason)
            info["error"] = err.code
            info["truncated"] = reason
            watch.complete = True
            err.request_id = info["request_id"]  # for the envelopes that carry it (Anthropic's)
            await out(self.client.native_error(err) if boundary else b"", more=False)
            return max(err.status, 500)


def _observe(obs: RequestObserver, reader: NativeReader, info: dict[str, Any]) -> None:
    answer = reader.answer
    info["finish_reason"] = answer.finish_reason
    if answer.usage is not None:
        obs.usage(answer.usage)
        info["prompt_tokens"] = answer.usage.get("prompt_tokens")
        info["completion_tokens"] = answer.usage.get("completion_tokens")


def _response_headers(raw: Any) -> list[tuple[bytes, bytes]]:
    """The upstream's response headers that the client gets as they are (content type, rate limits, Retry-After,
    the upstream API's own ...)."""
    return [(k.lower(), v) for k, v in raw if k.lower().decode("latin-1") not in _NOT_PASSED]
