"""The WebSocket half of the front end: a connection the HTTP protocol (proxy/server/frontend.py) hands over after an
`Upgrade: websocket` request runs the ASGI app with a `websocket` scope, as any ASGI server would (ASGI's WebSocket
messages, with the `websocket.http.response` extension for refusals with a body). The protocol itself — handshake
checks, framing, masking, fragmentation, UTF-8, ping/pong, the close handshake, message size — is the `websockets`
package's sans-I/O `ServerProtocol`: this module only moves bytes between it, the transport and the app.

The front end's limits, for WebSocket connections:

- `max_client_connections`: an upgraded connection stays one of the open connections (it was counted when it
  opened, as HTTP);
- `header_timeout`, `max_header_bytes`: the upgrade request is an HTTP request, under the same guards;
- `max_body_bytes` is the largest message (a `response.create` is a request body): a larger one closes the
  connection with 1009 (message too big);
- `ws_idle_timeout`: no message from the client and none to it for this long closes the connection (1000);
- `keepalive_interval`: after this long without a frame sent, a ping goes out (load balancers and NATs see traffic
  during a long prefill, as an SSE stream's `: keep-alive`); pings and pongs do not count as activity;
- graceful shutdown: an idle connection is closed at once with 1001 (going away); one whose app is busy (a response
  in flight) when its app next waits for a message. The app sees `websocket.disconnect` either way. An app that
  always waits for messages (to learn at once that the client left) cannot be told busy from idle that way: it puts
  a callback under `SHUTDOWN_HOOK` in the scope, and shutting down calls it instead — the app then closes with
  1001 itself once its work in flight is done (proxy/server/responses_socket.py);
- a client that goes away: the app gets `websocket.disconnect` at once (it cancels the upstream request).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import deque
from typing import Any, Final, NamedTuple

from websockets.datastructures import Headers
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.server import ServerProtocol

_logger: Final = logging.getLogger("uvicorn.error")  # where the server's own errors go (as frontend.py)
_protocol_logger: Final = logging.getLogger("dialect_proxy.websocket")  # websockets' per-connection lines
_CLOSE_TIMEOUT: Final = 5.0  # seconds the client has to answer our close frame before the TCP connection is closed
_GOING_AWAY: Final = 1001
_NORMAL: Final = 1000
_ABNORMAL: Final = 1006
# The scope key of the app's shutdown callback (None until the app sets it): set, the app closes the connection itself
# when the server shuts down (the module docstring).
SHUTDOWN_HOOK: Final = "dialect_proxy.on_shutdown"


class WebSocketLimits(NamedTuple):  # (a tuple: pickled to each worker with the front end's limits)
    max_message_bytes: int = 4 * 1024 * 1024
    idle_timeout: float = 600.0
    ping_interval: float = 15.0


class WebSocketConnection:
    """One upgraded client connection (an asyncio protocol once `start` ran) and the ASGI app serving it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: Any, app: Any, server_state: Any,
                 scope: dict[str, Any], limits: WebSocketLimits, fresh_context: bool = False) -> None:
        self.loop = loop
        self.transport = transport
        self.app = app
        self.server_state = server_state
        self.scope = scope
        self.limits = limits
        self.fresh_context = fresh_context
        self.protocol = ServerProtocol(max_size=limits.max_message_bytes, logger=_protocol_logger)
        self.request: Request | None = None
        self.accepted = False
        self.closed = False  # the app has been told (or will be told next) that the connection is gone
        self.close_code: int | None = None
        self.shutting_down = False
        self._messages: deque[dict[str, Any]] = deque()  # for the app's receive()
        self._waiter: asyncio.Future[None] | None = None  # the app waits in receive()
        self._fragments: list[bytes] = []
        self._fragment_text = False
        self._writable: asyncio.Event | None = None
        self._write_paused = False
        self._last_message = loop.time()  # a data message received or sent (the idle limit)
        self._last_sent = loop.time()  # any frame sent (the ping interval)
        self._timer: asyncio.TimerHandle | None = None
        self._close_timer: asyncio.TimerHandle | None = None
        self._connect_sent = False
        self._pending_response: tuple[int, list[Any]] = (500, [])  # websocket.http.response.start, until its body
        self._body: list[bytes] = []

    # -- hand-over ----------------------------------------------------------------------------------------------
    def start(self, head: bytes) -> None:
        """Take over the connection: `head` is the upgrade request's bytes as received (and any bytes after it)."""
        self.server_state.connections.add(self)
        self.protocol.receive_data(head)
        events = self.protocol.events_received()
        if not events or not isinstance(events[0], Request):  # not a valid HTTP request for websockets: a 400
            self.protocol.send_response(self.protocol.reject(400, "Invalid WebSocket upgrade request.\n"))
            self._flush()
            self.closed = True
            self.server_state.connections.discard(self)
            return
        self.request = events[0]
        self._frames(events[1:])
        if self.fresh_context:
            task = self.loop.create_task(self._run(), context=contextvars.Context())
        else:
            task = self.loop.create_task(self._run())
        task.add_done_callback(self.server_state.tasks.discard)
        self.server_state.tasks.add(task)
        self._schedule()

    async def _run(self) -> None:
        try:
            result = await self.app(self.scope, self.receive, self.send)
        except BaseException as exc:
            _logger.error("Exception in ASGI application\n", exc_info=exc)
            if not self.accepted and not self.closed:
                self._respond(500, [(b"content-type", b"text/plain; charset=utf-8")], b"Internal Server Error")
            else:
                self._close(1011, "internal error")
            if isinstance(exc, asyncio.CancelledError):
                raise
        else:
            if result is not None:
                _logger.error("ASGI callable should return None, but returned '%s'.", result)
            if not self.accepted and not self.closed:
                self._respond(403, [], b"")  # ASGI: an app that never accepts refuses with 403
            else:
                self._close(_NORMAL, "")

    # -- asyncio protocol ---------------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        self.protocol.receive_data(data)
        self._frames(self.protocol.events_received())
        self._flush()

    def eof_received(self) -> None:
        self.protocol.receive_eof()
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server_state.connections.discard(self)
        for timer in (self._timer, self._close_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._close_timer = None
        received = self.protocol.close_rcvd
        self._gone(received.code if received is not None else _ABNORMAL)
        self.resume_writing()

    def pause_writing(self) -> None:
        self._write_paused = True
        if self._writable is None:
            self._writable = asyncio.Event()
        self._writable.clear()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._writable is not None:
            self._writable.set()

    def shutdown(self) -> None:
        """uvicorn's server, shutting down: close now if the app waits for a message, else when it next does; or
        tell the app, if it asked to close by itself (SHUTDOWN_HOOK)."""
        self.shutting_down = True
        hook = self.scope.get(SHUTDOWN_HOOK)
        if not self.accepted:
            self.transport.close()
        elif hook is not None:
            hook()
        elif self._waiter is not None and not self._messages:
            self._close(_GOING_AWAY, "server shutting down")

    # -- ASGI ---------------------------------------------------------------------------------------------------
    async def receive(self) -> dict[str, Any]:
        if self.request is not None and not self.accepted and not self.closed and not self._connect_sent:
            self._connect_sent = True
            return {"type": "websocket.connect"}
        while not self._messages:
            if self.shutting_down and self.accepted and not self.closed and self.scope.get(SHUTDOWN_HOOK) is None:
                self._close(_GOING_AWAY, "server shutting down")
                continue
            if self.closed:
                return {"type": "websocket.disconnect", "code": self.close_code or _ABNORMAL}
            self._waiter = self.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._messages.popleft()

    async def send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if self._write_paused and not self.closed and self._writable is not None:
            await self._writable.wait()
        if kind == "websocket.accept":
            self._accept(message)
        elif kind == "websocket.send":
            if self.closed or not self.accepted:
                return  # the client is gone: the app learns it from receive()
            text = message.get("text")
            if text is not None:
                self.protocol.send_text(text.encode())
            else:
                self.protocol.send_binary(message.get("bytes") or b"")
            self._last_message = self.loop.time()
            self._flush()
        elif kind == "websocket.close":
            if not self.accepted:
                self._respond(403, [], b"")
            else:
                self._close(int(message.get("code") or _NORMAL), str(message.get("reason") or ""))
        elif kind == "websocket.http.response.start":
            self._pending_response = (int(message["status"]), list(message.get("headers") or ()))
        elif kind == "websocket.http.response.body":
            status, headers = self._pending_response
            self._body.append(bytes(message.get("body") or b""))
            if not message.get("more_body", False):
                self._respond(status, headers, b"".join(self._body))
        else:
            raise RuntimeError(f"Unexpected ASGI message '{kind}' on a WebSocket connection.")

    def _accept(self, message: dict[str, Any]) -> None:
        assert self.request is not None
        if self.accepted or self.closed:
            return
        response = self.protocol.accept(self.request)
        if response.status_code == 101:
            subprotocol = message.get("subprotocol")
            if subprotocol:
                response.headers["Sec-WebSocket-Protocol"] = subprotocol
            for name, value in message.get("headers") or ():
                response.headers[name.decode("latin-1")] = value.decode("latin-1")
        self.protocol.send_response(response)
        self._flush()
        if response.status_code == 101:
            self.accepted = True
        else:
            self._gone(_ABNORMAL)

    def _respond(self, status: int, headers: list[Any], body: bytes) -> None:
        """An HTTP answer to the upgrade request instead of the WebSocket (a refusal)."""
        if self.accepted or self.closed:
            return
        response = self.protocol.reject(status, "")
        response.headers = Headers([("Connection", "close"), ("Content-Length", str(len(body)))] + [
            (name.decode("latin-1"), value.decode("latin-1")) for name, value in headers
            if name.lower() not in (b"content-length", b"connection")])
        response = Response(response.status_code, response.reason_phrase, response.headers, body)
        self.protocol.send_response(response)
        self._flush()
        self._gone(_ABNORMAL)

    # -- frames -------------------------------------------------------------------------------------------------
    def _frames(self, events: list[Any]) -> None:
        for frame in events:
            if not isinstance(frame, Frame):
                continue
            opcode = frame.opcode
            if opcode is Opcode.TEXT or opcode is Opcode.BINARY:
                self._fragments = [bytes(frame.data)]
                self._fragment_text = opcode is Opcode.TEXT
            elif opcode is Opcode.CONT:
                self._fragments.append(bytes(frame.data))
            else:
                if opcode is Opcode.CLOSE:
                    received = self.protocol.close_rcvd
                    self._gone(received.code if received is not None else 1005)
                continue
            if not frame.fin:
                continue
            data = b"".join(self._fragments)
            self._fragments = []
            self._last_message = self.loop.time()
            if self._fragment_text:
                try:
                    text = data.decode()
                except UnicodeDecodeError:
                    self.protocol.fail(1007, "invalid UTF-8 in a text message")
                    self._gone(1007)
                    return
                self._deliver({"type": "websocket.receive", "text": text})
            else:
                self._deliver({"type": "websocket.receive", "bytes": data})
        if self.protocol.close_code is not None:  # websockets failed the connection (message too big, bad frames)
            self._gone(self.protocol.close_code)

    def _deliver(self, message: dict[str, Any]) -> None:
        if self.closed:
            return
        self._messages.append(message)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _gone(self, code: int) -> None:
        """The connection is over (or closing): the app's next receive() says so."""
        if not self.closed:
            self.closed = True
            self.close_code = code
        self._wake()

    def _close(self, code: int, reason: str) -> None:
        if self.protocol.state is State.OPEN:
            self.protocol.send_close(code, reason)
            self._flush()
        self._gone(code)

    def _flush(self) -> None:
        for data in self.protocol.data_to_send():
            if data:
                self.transport.write(data)
                self._last_sent = self.loop.time()
            elif not self.transport.is_closing():  # websockets: end of our side
                if self.transport.can_write_eof():
                    self.transport.write_eof()
                if self._close_timer is None:
                    self._close_timer = self.loop.call_later(_CLOSE_TIMEOUT, self.transport.close)
        if self.protocol.close_expected() and self._close_timer is None:
            self._close_timer = self.loop.call_later(_CLOSE_TIMEOUT, self.transport.close)

    # -- timers -------------------------------------------------------------------------------------------------
    def _schedule(self) -> None:
        limits = self.limits
        due = min(self._last_message + limits.idle_timeout, self._last_sent + limits.ping_interval)
        self._timer = self.loop.call_at(due, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self.closed or self.transport.is_closing():
            return
        now = self.loop.time()
        if now >= self._last_message + self.limits.idle_timeout:
            self._close(_NORMAL, "idle timeout")
            return
        if self.accepted and now >= self._last_sent + self.limits.ping_interval:
            self.protocol.send_ping(b"")
            self._flush()
        self._schedule()
