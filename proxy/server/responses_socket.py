"""The Responses API's WebSocket mode on `/v1/responses` (the Open Responses spec, "WebSocket Transport"): an ASGI
`websocket` app (its front end: proxy/server/websocket.py), served for a client dialect that declares a WebSocket
mode (proxy/clients/base.py `ClientDialect.websocket`).

Each text message `{"type": "response.create", ...rest of a Responses request body}` is one response, answered with
the same events as the SSE stream, each event's JSON one text message. Responses are made one at a time, in the
order asked (a message that arrives while one is in flight waits). Each is one exchange of the inference endpoint
(proxy/endpoint/exchange.py), called directly with the parsed message and a sink of this transport (`SocketSink`):
routing, retries, the upstream request, metrics, the access log line, cancellation, as for a streamed
`POST /v1/responses`. The encoder emits the same events as for HTTP; the sink sends each event's payload as one
message (no SSE framing, so none to decode).

- Continuation: `previous_response_id` is looked up in the connection's own state first (the most recent response
  answered on it, `store: false` too), then in the state store (`store: true` responses of any connection);
  proxy/clients/responses.py `for_socket`. A `store: false` response is known to its connection only: after a
  reconnect, continuing from it is `previous_response_not_found`.
- A turn that continues from a response and fails (an error status, `response.failed`) evicts that response from
  the connection's state: continuing from it again (`store: false`) is `previous_response_not_found`.
- Errors before a response starts are `{"type": "error", "status": <HTTP status>, "error": {code, message, param,
  type}}`; errors after it started are the stream's `response.failed`. The connection stays open after either.
- A message that is not JSON, not an object or not a `response.create` is an `error` (400); the connection stays.
- The connection ends after `ws_max_age` seconds (the spec's 60 minutes): `error` with code
  `websocket_connection_limit_reached` (status 400), then a close (1000) — at once when idle, else after the response
  in flight.
- The client leaving mid-response cancels it (the upstream request is closed at once, as for HTTP).
- Graceful shutdown (SIGTERM): the connection closes with 1001 (going away) at once when no response is in flight,
  else as soon as the one in flight has finished (within `shutdown_grace`; at its end the response gets the
  `shutting_down` failure, as on HTTP); messages still queued are not answered. The connection reads the client's
  messages all the time (to learn at once that the client left), so the front end cannot see when it is idle: it
  calls the connection's `shutdown` instead (SHUTDOWN_HOOK, proxy/server/websocket.py).
- A request passed through to an upstream that speaks the Responses API natively (proxy/endpoint/passthrough.py):
  the upstream's SSE events, each one message, as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any, Final

import orjson

from proxy.endpoint.inference import KEY_NAME_SCOPE, InferenceEndpoint
from proxy.endpoint.record import AccessRecord
from proxy.endpoint.request import Disconnect, take_request_id
from proxy.hub.sse import SSEDecoder
from proxy.server.websocket import SHUTDOWN_HOOK

if TYPE_CHECKING:
    from proxy.clients.base import ClientDialect, Headers
    from proxy.errors import ProxyError
    from proxy.gateway.limits import LimitView
    from proxy.hub.sse import Event
    from proxy.server.appstate import AppState

access_log: Final = logging.getLogger("dialect_proxy.access")
_STOP: Final = {"type": "dialect_proxy.shutdown"}  # queued for the connection's loop when the server shuts down
_GOING_AWAY: Final = 1001


def error_event(status: int, error: dict[str, Any]) -> str:
    """The spec's WebSocket error envelope (`code` a string: our envelopes always carry one)."""
    payload = {"type": error.get("type"), "code": error.get("code") or error.get("type") or "error",
               "message": error.get("message") or "", "param": error.get("param")}
    return orjson.dumps({"type": "error", "status": status, "error": payload}).decode()


class ResponsesSocket:
    """The ASGI `websocket` endpoint of a client dialect's path."""

    def __init__(self, state: AppState, client: ClientDialect[Any]) -> None:
        self.state = state
        self.client = client
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        if self.state.shutting_down:
            body = orjson.dumps({"error": {"message": "The proxy is shutting down.", "type": "service_unavailable",
                                           "param": None, "code": "shutting_down"}})
            await send({"type": "websocket.http.response.start", "status": 503,
                        "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1")]})
            await send({"type": "websocket.http.response.body", "body": body})
            return
        connection = _Connection(self, scope, receive, send)
        scope[SHUTDOWN_HOOK] = connection.shutdown
        await send({"type": "websocket.accept"})
        await connection.run()


class _Connection:
    """One WebSocket connection's turns."""

    def __init__(self, socket: ResponsesSocket, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.state = socket.state
        self.cache: dict[str, bytes] = {}
        self.endpoint = InferenceEndpoint(socket.state, socket.client.for_socket(self.cache))
        self.scope = scope
        self.receive = receive
        self.send = send
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.watch: Disconnect | None = None  # the disconnect watch of the response in flight
        self.gone = False
        self.responses = 0
        self.busy = False  # a response is in flight
        self.stopping = False  # the server is shutting down: close after the response in flight

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        opened = loop.time()
        started = time.perf_counter()
        reader = asyncio.ensure_future(self._read())
        close_code = 1000
        try:
            while True:
                left = opened + self.state.settings.server.ws_max_age - loop.time()
                try:
                    message = await asyncio.wait_for(self.inbox.get(), timeout=max(left, 0.0))
                except TimeoutError:
                    await self._text(error_event(400, {
                        "type": "invalid_request_error", "code": "websocket_connection_limit_reached",
                        "message": f"This WebSocket has been open for {self.state.settings.server.ws_max_age:g} s, "
                                   "its limit: open a new one."}))
                    await self.send({"type": "websocket.close", "code": 1000, "reason": "connection limit"})
                    break
                if message["type"] == "websocket.disconnect":
                    close_code = int(message.get("code") or 1005)
                    break
                if message is not _STOP:
                    await self._turn(message)
                if self.stopping:
                    close_code = _GOING_AWAY
                    await self.send({"type": "websocket.close", "code": _GOING_AWAY, "reason": "server shutting down"})
                    break
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            if access_log.isEnabledFor(logging.INFO):
                access_log.info(orjson.dumps({
                    "route": "/v1/responses", "websocket": True, "responses": self.responses,
                    "close_code": close_code, "duration_ms": round((time.perf_counter() - started) * 1000, 2),
                }).decode())

    def shutdown(self) -> None:
        """The server shuts down (proxy/server/websocket.py calls this): close now when idle, else after the response in
        flight."""
        self.stopping = True
        if not self.busy:
            self.inbox.put_nowait(_STOP)

    async def _read(self) -> None:
        """Every message of the client, in order; a disconnect also cancels the response in flight."""
        while True:
            message = await self.receive()
            self.inbox.put_nowait(message)
            if message["type"] == "websocket.disconnect":
                self.gone = True
                if self.watch is not None:
                    self.watch.lost()
                return

    async def _text(self, text: str) -> None:
        if not self.gone:
            await self.send({"type": "websocket.send", "text": text})

    async def _turn(self, message: dict[str, Any]) -> None:
        raw = message.get("text")
        if raw is None:
            raw = (message.get("bytes") or b"").decode("utf-8", "replace")
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            await self._text(error_event(400, {"type": "invalid_request_error", "code": "invalid_json",
                                               "message": f"The message is not valid JSON ({e})."}))
            return
        if not isinstance(body, dict) or body.get("type") != "response.create":
            await self._text(error_event(400, {
                "type": "invalid_request_error", "code": "invalid_event_type", "param": "type",
                "message": "Send `response.create` messages: {\"type\": \"response.create\", \"model\": ..., "
                           "\"input\": ...}."}))
            return
        body.pop("type")
        body.pop("stream_options", None)  # HTTP transport fields (the spec: not sent on a WebSocket)
        body["stream"] = True
        previous = body.get("previous_response_id")
        self.busy = True
        try:
            failed = await self._respond(body)
        finally:
            self.busy = False
        self.responses += 1
        if failed and isinstance(previous, str):
            self.cache.pop(previous, None)

    async def _respond(self, body: dict[str, Any]) -> bool:
        """One response through the inference endpoint's exchange; True when it failed (an error, or an answer that
        did not complete)."""
        started = time.perf_counter()
        record = AccessRecord(take_request_id(b"")[0], self.endpoint.route, self.scope.get(KEY_NAME_SCOPE))
        try:
            status = await self.endpoint.serve(_Message(self, body), SocketSink(self), record, started)
        finally:
            self.watch = None
        return status != 200 or record.error is not None  # (a failure after the head keeps an HTTP stream's 200)


class _Message:
    """A `response.create` message as the exchange's request: parsed already, without headers of its own."""

    __slots__ = ("body", "connection", "headers")

    def __init__(self, connection: _Connection, body: dict[str, Any]) -> None:
        self.connection = connection
        self.body = body
        self.headers: Headers = []

    async def read(self) -> bytes | None:
        return None

    def parse(self, raw: bytes | None) -> dict[str, Any]:
        return self.body

    def watch(self) -> Disconnect:
        """The connection's reader tells the watch when the client leaves."""
        watch = self.connection.watch = Disconnect()
        return watch


class SocketSink:
    """One response's events, each one text message (proxy/endpoint/sink.py `Sink`)."""

    __slots__ = ("connection", "decoder", "status")

    def __init__(self, connection: _Connection) -> None:
        self.connection = connection
        self.status = 200
        self.decoder: SSEDecoder | None = None  # a passed-through answer's SSE events

    async def start(self, status: int, headers: Headers) -> None:
        self.status = status

    async def events(self, events: list[Event], more: bool) -> None:
        for event in events:
            await self.connection._text(event.data.decode())

    def limits(self, view: LimitView) -> None:
        """A WebSocket has no headers to tell them in (a refusal is its `error` message)."""

    async def native(self, data: bytes, more: bool) -> None:
        """The upstream's own answer: its SSE events' data, or its error (in the Responses envelope already)."""
        if self.status != 200:
            try:
                error = orjson.loads(data)["error"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                error = {"type": "server_error", "code": "internal_error", "message": "Internal error."}
            await self.connection._text(error_event(self.status, error))
            return
        if self.decoder is None:
            self.decoder = SSEDecoder()
        for event in self.decoder.feed(bytes(data)):
            if event.data:
                await self.connection._text(event.data)

    async def keepalive(self, pending: list[Event], event: Event | None) -> None:
        await self.events(pending, True)  # no keep-alive event: the front end pings a quiet connection

    async def whole(self, body: bytes, headers: Headers) -> None:
        await self.connection._text(body.decode())  # (not asked for: a socket's requests stream)

    async def refuse(self, err: ProxyError, headers: Headers) -> int:
        error = err.envelope()["error"]
        assert isinstance(error, dict)
        await self.connection._text(error_event(err.status, error))
        return err.status
