"""The HTTP front end's own limits: header size, time to receive a request, number of client connections.

uvicorn's httptools protocol has none of these: a client may send headers forever (slowloris), megabytes of them,
or open connections without sending anything, and each is held. `GuardedHttpToolsProtocol` is uvicorn's httptools
protocol with three guards, all below the ASGI app (so they hold for every route, before any handler runs):

- `max_header_bytes`: the request line and headers together; more gets `431` and the connection is closed. Counted
  as bytes arrive, so a head that never ends is refused as soon as it is too long, not when it is complete.
- `header_timeout`: the request line and headers must be complete within this many seconds of the request's first
  byte (or of the connection's opening, for a connection that sends nothing); otherwise `408` and close.
  `body_timeout`: the body must then be complete within this many seconds; otherwise `408` (if no answer has
  started) and close — the handler sees the client leave, as for any disconnect.
- `max_client_connections`: a connection beyond this many open ones gets `503` at once and is closed.

It also tells the handler at once when a client goes away mid-request: the handler puts a callback under
`DISCONNECT_HOOK` in the request's scope (proxy/handlers.py), called from `connection_lost` while the answer is
incomplete — cheaper than a task per request waiting on `receive()` for `http.disconnect` (the fallback under any
other server).

Idle kept-alive connections are closed after uvicorn's `timeout_keep_alive` (5 s). The limits reach the protocol
through `functools.partial` (uvicorn's `http` setting takes any protocol factory; a partial of a module-level class
pickles, so `--workers` > 1 works too).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from .errors import ProxyError
from .settings import ServerSettings

# The scope key of the handler's disconnect callback: present (None until the handler sets it) on every request this
# front end serves.
DISCONNECT_HOOK = "dialect_proxy.on_disconnect"


class FrontendLimits(NamedTuple):  # (a tuple: `--workers` pickles it to each worker, compiled build or not)
    max_header_bytes: int = 65536
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    max_client_connections: int = 2048

    @classmethod
    def from_settings(cls, server: ServerSettings) -> FrontendLimits:
        return cls(server.max_header_bytes, server.header_timeout, server.body_timeout, server.max_client_connections)


def frontend_options(server: ServerSettings) -> dict[str, Any]:
    """uvicorn.Config keyword arguments for the proxy's front end. No `server: uvicorn` header: it names the software
    to anyone who asks, and is one more header to validate and write per answer."""
    return {"http": functools.partial(GuardedHttpToolsProtocol, limits=FrontendLimits.from_settings(server)),
            "server_header": False}


class _Refuse(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, limits: FrontendLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._head_done = False  # the current request's headers are complete
        self._head_bytes = 0  # bytes received for the current request's head so far
        self._timer: asyncio.TimerHandle | None = None
        self._due: float | None = None  # when the running limit (header or body time) is up
        self._refused = False

    # -- connection ---------------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._out = _HeadWithBody(transport)  # what each response's cycle writes to
        if len(self.connections) > self.limits.max_client_connections:
            self.logger.warning("Refused a connection: %d client connections are open.", len(self.connections) - 1)
            self._refuse(503, "The proxy has too many open connections; retry later.")
            return
        self._arm(self.limits.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        cycle = self.cycle
        incomplete = cycle is not None and not cycle.response_complete
        super().connection_lost(exc)
        if incomplete:
            assert cycle is not None
            hook: Callable[[], None] | None = cycle.scope.get(DISCONNECT_HOOK)  # type: ignore[assignment]
            if hook is not None:
                hook()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        self._unset_keepalive_if_required()
        if not self._head_done:
            self._head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._unsupported_upgrade_warning()
            self._refuse(400, "Protocol upgrades are not supported.")
            return
        except httptools.HttpParserError as e:
            cause = e.__cause__ or e.__context__
            if isinstance(cause, _Refuse):
                self._refuse(cause.status, str(cause))
            else:
                self.logger.warning("Invalid HTTP request received.")
                self._refuse(400, "Invalid HTTP request.")
            return
        if not self._head_done and self._head_bytes > self.limits.max_header_bytes:
            self._refuse(431, f"The request's headers are larger than {self.limits.max_header_bytes} bytes.")

    # -- parser callbacks ---------------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._due is None:  # a new request on a kept-alive connection
            self._arm(self.limits.header_timeout)

    def on_headers_complete(self) -> None:
        self._head_done = True
        if self._head_bytes > self.limits.max_header_bytes:  # the whole head arrived in one read
            size = len(self.url) + sum(len(k) + len(v) + 4 for k, v in self.headers)
            if size > self.limits.max_header_bytes:
                raise _Refuse(431, f"The request's headers are larger than {self.limits.max_header_bytes} bytes.")
        self._arm(self.limits.body_timeout)
        super().on_headers_complete()
        self.scope[DISCONNECT_HOOK] = None  # type: ignore[literal-required]  # this front end calls the handler's hook
        self.cycle.transport = self._out
        if self.pipeline:  # queued behind the answer in progress; uvicorn stops reading until its turn
            self._disarm()

    def on_response_complete(self) -> None:
        self._out.next_response()  # a response without body bytes (HEAD): its head goes out now
        super().on_response_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        self._head_done = False
        self._head_bytes = 0
        super().on_message_complete()

    # -- guards -------------------------------------------------------------------------------------------------
    # One loop timer per connection, re-armed only when it fires early: a phase change just moves `_due` (a
    # kept-alive connection's requests cost no timer calls; ~3 µs each here). `_due` None: no limit runs.
    def _arm(self, seconds: float) -> None:
        due = self.loop.time() + seconds
        self._due = due
        timer = self._timer
        if timer is None or timer.when() > due:
            if timer is not None:
                timer.cancel()
            self._timer = self.loop.call_at(due, self._check)

    def _disarm(self) -> None:
        self._due = None

    def _check(self) -> None:
        self._timer = None
        due = self._due
        if due is None:
            return
        if self.loop.time() < due:
            self._timer = self.loop.call_at(due, self._check)
            return
        self._due = None
        self._timed_out()

    def _timed_out(self) -> None:
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if self.pipeline or (cycle is not None and not cycle.response_complete and cycle.response_started):
            self.transport.close()  # an answer is already on its way: nothing else can be said
            return
        which = "body" if self._head_done else "headers"
        limit = self.limits.body_timeout if self._head_done else self.limits.header_timeout
        self._refuse(408, f"The request's {which} did not arrive within {limit:g} s.")

    def _refuse(self, status: int, message: str) -> None:
        """Answer with the OpenAI error envelope and close (the connection's state cannot be trusted any more)."""
        self._refused = True
        self._disarm()
        if self.transport.is_closing():
            return
        body = ProxyError(message, status, code=_CODES.get(status)).body()
        head = [STATUS_LINE[status], b"content-type: application/json\r\n",
                b"content-length: %d\r\n" % len(body), b"connection: close\r\n"]
        if status == 503:
            head.append(b"retry-after: 1\r\n")
        if 400 <= status < 500 and status != 408:
            head.append(b"x-should-retry: false\r\n")
        self.transport.write(b"".join(head) + b"\r\n" + body)
        # Lingering close: closing a socket with unread input makes the kernel send a reset, which can destroy the
        # answer before the client reads it. So: end our side, discard what still comes, close after a moment.
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(_LINGER, self.transport.close)
        else:
            self.transport.close()


class _HeadWithBody(asyncio.Transport):
    """The connection's transport as its responses' cycles see it: a response's status line and headers (its first
    write) are held and go out in one write with its first body bytes, not in a write of their own. On loopback and
    in VMs each write that reaches an idle reader costs a wake-up; a non-stream answer now costs one write, not two.
    A held head goes out with the next write, on close, and when the response completes (`next_response`, called by
    GuardedHttpToolsProtocol.on_response_complete: a HEAD answer has no body bytes). `100 Continue` is never held
    (the client waits for it before it sends the body). Responses on a connection are sequential, so one object
    serves them all."""

    __slots__ = ("_first", "_held", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        super().__init__()
        self._transport = transport
        self._held: bytes | None = None
        self._first = True  # the next write is a response's head

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif self._first and data[:13] != b"HTTP/1.1 100 ":
            self._first = False
            self._held = bytes(data)
        else:
            self._transport.write(data)

    def next_response(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held)
        self._first = True

    def close(self) -> None:
        self.next_response()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)


_LINGER = 2.0  # seconds a refused connection is still read (and discarded) before it is closed

_CODES = {400: "invalid_request", 408: "request_timeout", 431: "request_header_fields_too_large",
          503: "too_many_connections"}
