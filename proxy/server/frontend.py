"""The HTTP/1.1 front end: uvicorn's server around the proxy's own connection protocol, with its own limits.

uvicorn runs the server (sockets, workers, lifespan, signals, graceful shutdown, the `date` header); each client
connection is a `GuardedHttpToolsProtocol`, which parses requests with httptools and runs the ASGI app once per
request (a `Cycle`), as uvicorn's httptools protocol does: the same scope, the same `receive`/`send` messages and
checks (header names and values, content-length against the body, `connection: close`, chunked encoding when no
length is given, HEAD, `Expect: 100-continue`, pipelined requests answered in order, back-pressure both ways, a 500
when the app fails before answering). It is the proxy's own so that the per-request path compiles with the rest of
it (setup.py); docs/decisions.md ("The HTTP front end") compares it with uvicorn's own protocol and with granian.

It is built on public interfaces only: httptools' parser, asyncio's transport (`get_extra_info` for the addresses
and TLS), http.HTTPStatus for the reason phrases, and what uvicorn hands any protocol factory given as its `http`
setting (its Config: the app, root_path, asgi_version, timeout_keep_alive; its ServerState: the connections, the
tasks, the `date` header). No module of uvicorn's protocols is imported: the header rules, the status lines and the
back-pressure mark are written here.

Beyond uvicorn's protocol:

- `max_header_bytes`: the request line and headers together; more gets `431` and the connection is closed. Counted
  as bytes arrive, so a head that never ends is refused as soon as it is too long, not when it is complete.
- `header_timeout`: the request line and headers must be complete within this many seconds of the request's first
  byte (or of the connection's opening, for a connection that sends nothing); otherwise `408` and close.
  `body_timeout`: the body must then be complete within this many seconds; otherwise `408` (if no answer has
  started) and close — the handler sees the client leave, as for any disconnect.
- `max_client_connections`: a connection beyond this many open ones gets `503` at once and is closed. The limit
  never exceeds what the process can open (`connection_limit`): each served connection may need an upstream one,
  and a refused one holds its descriptor while it lingers, so that the kernel never refuses an `accept` (uvloop would
  then drop waiting connections without a word).
- A response's status line and headers go out in one write with its first body bytes (on loopback and in VMs each
  write that reaches an idle reader costs a wake-up: a non-stream answer is one write, not two).
- An `Upgrade: websocket` request is handed, with the connection, to proxy/server/websocket.py (the `websockets`
  package's protocol), which runs the app with a `websocket` scope; other upgrades are refused with `400`.
- No access log of uvicorn's: the proxy writes its own (proxy/endpoint/exchange.py).

It also tells the handler at once when a client goes away mid-request: the handler puts a callback under
`DISCONNECT_HOOK` in the request's scope (proxy/endpoint/request.py), called from `connection_lost` while the answer
is incomplete — cheaper than a task per request waiting on `receive()` for `http.disconnect` (the fallback under any
other server).

Idle kept-alive connections are closed after uvicorn's `timeout_keep_alive` (5 s), a limit kept on the same loop
timer as `header_timeout` and `body_timeout` (uvicorn arms a timer of its own after each answer). The limits reach
the protocol through `functools.partial` (uvicorn's `http` setting takes any protocol factory; a partial of a
module-level class pickles, so `--workers` > 1 works too).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import http
import logging
import re
import resource
import urllib.parse
from collections import deque
from collections.abc import Callable
from typing import Any, Final, NamedTuple

import httptools

from proxy.endpoint.request import DISCONNECT_HOOK
from proxy.errors import ProxyError
from proxy.server.websocket import WebSocketConnection, WebSocketLimits
from proxy.settings import ServerSettings

_logger: Final = logging.getLogger("uvicorn.error")  # where uvicorn's own protocol logs (the server's log settings)
# A header name must be a token (RFC 9110 5.6.2: one or more of ALPHA, DIGIT and !#$%&'*+-.^_`|~); a value must hold
# no control character but tab (RFC 9110 5.5: VCHAR and obs-text, SP and HTAB between). A value that carried CR LF
# would split the answer. Each search finds the first byte that breaks its rule.
_bad_name: Final = re.compile(rb"[^!#$%&'*+\-.^_`|~0-9A-Za-z]|^$").search
_bad_value: Final = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]").search
# Those control characters to a space, every other byte to itself: a value without one translates to the very same
# object (a C loop, cheaper than a regex search when compiled); one that changes is searched to be sure
_VALUE_OK: Final = bytes(32 if b < 9 or 9 < b < 32 or b == 127 else b for b in range(256))
_NAMES_MAX: Final = 256  # header names checked once and remembered, lower-cased (the proxy sends a few dozen)
_names: Final[dict[bytes, bytes]] = {}


def _status_line(code: int) -> bytes:
    try:
        phrase = http.HTTPStatus(code).phrase.encode("ascii")
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %b\r\n" % (code, phrase)


# The status line of every code from 100 to 599, with its reason phrase where http.HTTPStatus knows one (the phrase
# may be empty, RFC 9112 4: an unknown code gets "HTTP/1.1 599 \r\n").
_STATUS_LINE: Final = {code: _status_line(code) for code in range(100, 600)}
# Request body bytes held for the app before reading from the client pauses (what `receive` has not taken yet).
_BODY_HIGH_WATER: Final = 65536
# A chunk of at least this many bytes (a fast stream's read of many events) is written as its pieces, its framing
# around it, not copied into one framed buffer: uvloop writes the list with one writev. Below it the copy is the
# cheaper (measured on loopback: docs/speed.md).
_SCATTER: Final = 4096
# The size line of a smaller chunk, made once per size seen: `b"%x" % n` parses its format at every call, where this
# is a list index (docs/speed.md).
_chunk_heads: Final[list[bytes | None]] = [None] * _SCATTER


class FrontendLimits(NamedTuple):  # (a tuple: `--workers` pickles it to each worker, compiled build or not)
    max_header_bytes: int = 65536
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    max_client_connections: int = 2048
    websocket: WebSocketLimits = WebSocketLimits()

    @classmethod
    def from_settings(cls, server: ServerSettings) -> FrontendLimits:
        websocket = WebSocketLimits(server.max_body_bytes, server.ws_idle_timeout, server.keepalive_interval)
        return cls(server.max_header_bytes, server.header_timeout, server.body_timeout,
                   connection_limit(server.max_client_connections), websocket)


# Descriptors the process needs besides client and upstream connections: standard streams, the listening socket,
# the event loop's own, log files, the state store's connections, metric files (`--workers`), DNS lookups.
FD_RESERVE: Final = 32


def linger_band(limit: int) -> int:
    """How many refused connections may linger (`_refuse`) beyond `limit` served ones."""
    return max(4, limit // 4)


def connection_limit(configured: int) -> int:
    """`configured` (max_client_connections), lowered to what the process can open: its RLIMIT_NOFILE (the soft
    limit is first raised to the hard one, as Go's runtime does) less FD_RESERVE, shared by the client connections,
    as many upstream connections (one per request under way) and the refused connections that linger. Logged when
    lowered."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass  # (a hard limit the kernel caps lower: keep the soft one)
    if soft == resource.RLIM_INFINITY:
        return configured
    # limit (clients) + limit (upstream) + limit // 4 (lingering) <= soft - FD_RESERVE
    fits = max(1, (soft - FD_RESERVE) * 4 // 9)
    if fits < configured:
        _logger.warning("max_client_connections lowered from %d to %d: the process may open %d files "
                        "(RLIMIT_NOFILE), which upstream connections share; raise it with `ulimit -n`.",
                        configured, fits, soft)
        return fits
    return configured


def frontend_options(server: ServerSettings) -> dict[str, Any]:
    """uvicorn.Config keyword arguments for the proxy's front end. No `server: uvicorn` header: it names the software
    to anyone who asks, and is one more header to validate and write per answer."""
    return {"http": functools.partial(GuardedHttpToolsProtocol, limits=FrontendLimits.from_settings(server)),
            "server_header": False}


def _address(info: Any) -> tuple[str, int | None] | None:
    """A socket address as ASGI's scope has it: (host, port) for IPv4 and IPv6 (whose flow info and scope id are
    dropped), (path, None) for a Unix socket, None when the transport does not say."""
    if isinstance(info, (tuple, list)) and len(info) >= 2:
        return (str(info[0]), int(info[1]))
    if isinstance(info, str) and info:
        return (info, None)
    return None


class _Refuse(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _header_name(name: bytes) -> bytes:
    """`name` lower-cased, after checking it is a token (remembered: names come from a small set)."""
    lower = _names.get(name)
    if lower is None:
        if _bad_name(name) is not None:
            raise RuntimeError("Invalid HTTP header name.")
        lower = name.lower()
        if len(_names) < _NAMES_MAX:
            _names[name] = lower
    return lower


class GuardedHttpToolsProtocol:
    """One client connection (an asyncio protocol): httptools' parser callbacks, the guards, and one `Cycle` per
    request."""

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None, *, limits: FrontendLimits) -> None:
        if not config.loaded:
            config.load()
        self.app: Any = config.loaded_app
        self.loop: asyncio.AbstractEventLoop = _loop or asyncio.get_event_loop()
        self.parser: Any = httptools.HttpRequestParser(self)
        try:  # answer the first of pipelined requests even when the client closes its side after sending them
            self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        except AttributeError:  # httptools < 0.6.3
            pass
        self.root_path: str = config.root_path
        self.asgi_version: str = config.asgi_version
        self.timeout_keep_alive: float = config.timeout_keep_alive
        self.fresh_context = bool(getattr(config, "reset_contextvars", False))  # uvicorn >= 0.36's option
        self.app_state = app_state
        self.server_state: Any = server_state
        self.connections: set[Any] = server_state.connections
        self.tasks: set[asyncio.Task[None]] = server_state.tasks
        self.limits = limits
        # The connection
        self.transport: Any = None
        self.server: tuple[str, int | None] | None = None
        self.client: tuple[str, int] | None = None
        self.scheme = "http"
        self.pipeline: deque[tuple[Cycle, Any]] = deque()  # requests received while an answer is in progress
        self.read_paused = False
        self.write_paused = False
        self._writable: asyncio.Event | None = None  # made when writing first pauses
        # The request being received
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.scope: dict[str, Any] = {}
        self.expect_100_continue = False
        self.cycle: Cycle | None = None  # the latest request's (answered, being answered or queued)
        # The guards
        self._head_done = False  # the current request's headers are complete
        self._head_bytes = 0  # bytes received for the current request's head so far
        self._timer: asyncio.TimerHandle | None = None
        self._due: float | None = None  # when the running limit (header, body or keep-alive time) is up
        self._idle = False  # the running limit is the keep-alive wait between two requests
        self._refused = False
        self._upgrading = False  # the request asks for a protocol upgrade: no cycle runs for it

    # -- connection ---------------------------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.connections.add(self)
        self.transport = transport
        self.server = _address(transport.get_extra_info("sockname"))
        peer = _address(transport.get_extra_info("peername"))
        self.client = (peer[0], peer[1]) if peer is not None and peer[1] is not None else None
        self.scheme = "https" if transport.get_extra_info("sslcontext") else "http"
        limit = self.limits.max_client_connections
        if len(self.connections) > limit:
            _logger.warning("Refused a connection: %d client connections are open.", len(self.connections) - 1)
            # Those refused that still linger count too: past the band, one is closed as soon as its answer is out.
            self._refuse(503, "The proxy has too many open connections; retry later.",
                         linger=len(self.connections) <= limit + linger_band(limit))
            return
        self._arm(self.limits.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.connections.discard(self)
        cycle = self.cycle
        incomplete = cycle is not None and not cycle.response_complete
        if cycle is not None:
            if incomplete:
                cycle.disconnected = True
            cycle.wake()
        self.resume_writing()
        if exc is None:
            self.transport.close()
        self.parser = None  # it holds this protocol: no reference cycle left behind
        self.pipeline.clear()  # queued requests never run now (their cycles hold this protocol)
        if incomplete:
            assert cycle is not None
            hook: Callable[[], None] | None = cycle.scope.get(DISCONNECT_HOOK)
            if hook is not None:
                hook()

    def eof_received(self) -> None:
        pass

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._idle:  # the keep-alive wait ends with the next request's first bytes (its header limit follows)
            self._disarm()
        if not self._head_done:
            self._head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            if self._upgrading and self._wants_websocket():
                self._to_websocket(data[upgrade.args[0]:])
            else:
                _logger.warning("Unsupported upgrade request.")
                self._refuse(400, "Protocol upgrades other than to a WebSocket are not supported.")
            return
        except httptools.HttpParserError as e:
            cause = e.__cause__ or e.__context__
            if isinstance(cause, _Refuse):
                self._refuse(cause.status, str(cause))
            else:
                _logger.warning("Invalid HTTP request received.")
                self._refuse(400, "Invalid HTTP request.")
            return
        if not self._head_done and self._head_bytes > self.limits.max_header_bytes:
            self._refuse(431, f"The request's headers are larger than {self.limits.max_header_bytes} bytes.")

    def shutdown(self) -> None:
        """uvicorn's server, shutting down: close an idle connection now, a busy one after its answer."""
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            self.transport.close()
        else:
            cycle.keep_alive = False

    # -- back-pressure --------------------------------------------------------------------------------------------
    # Flow control as fields of the protocol (what uvicorn's FlowControl class does, without an object per connection)
    def pause_writing(self) -> None:  # the transport's buffer is over its high-water mark
        if not self.write_paused:
            self.write_paused = True
            if self._writable is None:
                self._writable = asyncio.Event()
            self._writable.clear()

    def resume_writing(self) -> None:
        if self.write_paused:
            self.write_paused = False
            if self._writable is not None:
                self._writable.set()

    async def drain(self) -> None:
        if self._writable is not None:
            await self._writable.wait()

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()

    # -- parser callbacks ---------------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self.scope = {
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": self.root_path,
            "headers": self.headers,
            "state": self.app_state.copy(),
            DISCONNECT_HOOK: None,  # this front end calls the handler's hook
        }
        if self._due is None:  # a new request on a kept-alive connection
            self._arm(self.limits.header_timeout)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._head_done = True
        limits = self.limits
        if self._head_bytes > limits.max_header_bytes:  # the whole head arrived in one read
            size = len(self.url) + sum(len(k) + len(v) + 4 for k, v in self.headers)
            if size > limits.max_header_bytes:
                raise _Refuse(431, f"The request's headers are larger than {limits.max_header_bytes} bytes.")
        self._arm(limits.body_timeout)
        parser = self.parser
        scope = self.scope
        http_version: str = parser.get_http_version()
        method: str = parser.get_method().decode("ascii")
        scope["method"] = method
        if http_version != "1.1":
            scope["http_version"] = http_version
        url: Any = httptools.parse_url(self.url)
        raw_path: bytes = url.path
        query: bytes | None = url.query  # None when the target has no `?` (the stubs say bytes)
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        root = self.root_path
        scope["path"] = root + path if root else path
        scope["raw_path"] = root.encode("ascii") + raw_path if root else raw_path
        scope["query_string"] = query or b""
        previous = self.cycle
        if parser.should_upgrade():  # answered when the parser stops at the upgrade (data_received)
            self._upgrading = previous is None or previous.response_complete
            return
        app = self.app
        keep_alive = http_version != "1.0" and bool(parser.should_keep_alive())
        cycle = Cycle(self, scope, method == "HEAD", self.expect_100_continue, keep_alive)
        self.cycle = cycle
        if previous is None or previous.response_complete:
            self._start(cycle, app)
        else:  # pipelined: queued behind the answer in progress, and reading stops until its turn
            self.pause_reading()
            self.pipeline.appendleft((cycle, app))
            self._disarm()

    def _wants_websocket(self) -> bool:
        return any(name == b"upgrade" and value.lower() == b"websocket" for name, value in self.headers)

    def _to_websocket(self, rest: bytes) -> None:
        """Hand the connection over to proxy/server/websocket.py: the upgrade request as received (rebuilt from what the
        parser read, then any bytes after it), the scope of ASGI's `websocket` type."""
        self._refused = True  # this protocol is done with the connection
        self._disarm()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        scope = self.scope
        head = [scope["method"].encode("ascii"), b" ", self.url, b" HTTP/1.1\r\n"]
        for name, value in self.headers:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"\r\n")
        offered = b",".join(value for name, value in self.headers if name == b"sec-websocket-protocol")
        ws_scope = {
            "type": "websocket",
            "asgi": {"version": self.asgi_version, "spec_version": "2.4"},
            "http_version": "1.1",
            "scheme": "wss" if self.scheme == "https" else "ws",
            "server": self.server,
            "client": self.client,
            "root_path": self.root_path,
            "path": scope["path"],
            "raw_path": scope["raw_path"],
            "query_string": scope["query_string"],
            "headers": self.headers,
            "subprotocols": [p.strip() for p in offered.decode("latin-1").split(",") if p.strip()],
            "state": scope["state"],
            "extensions": {"websocket.http.response": {}},
        }
        connection = WebSocketConnection(self.loop, self.transport, self.app, self.server_state, ws_scope,
                                         self.limits.websocket, self.fresh_context)
        self.connections.discard(self)  # the WebSocket connection counts in its place
        self.transport.set_protocol(connection)
        self.parser = None
        self.pipeline.clear()
        connection.start(b"".join(head) + rest)

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return
        cycle.body += body
        if len(cycle.body) > _BODY_HIGH_WATER:
            self.pause_reading()
        cycle.wake()

    def on_message_complete(self) -> None:
        self._disarm()
        self._head_done = False
        self._head_bytes = 0
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return
        cycle.more_body = False
        cycle.wake()

    def on_response_complete(self) -> None:
        """Called by the cycle when its answer is complete: the next pipelined request, or the keep-alive wait."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start(cycle, app)
        elif self._due is None:  # no next request begun: the keep-alive wait, on the guards' timer
            self._arm(self.timeout_keep_alive)
            self._idle = True

    def _start(self, cycle: Cycle, app: Any) -> None:
        if self.fresh_context:
            task = self.loop.create_task(cycle.run_asgi(app), context=contextvars.Context())
        else:
            task = self.loop.create_task(cycle.run_asgi(app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    # -- guards -------------------------------------------------------------------------------------------------
    # One loop timer per connection for its three limits (a request's header time, its body time, the keep-alive
    # wait after its answer), re-armed only when it fires early: a phase change just moves `_due`, so a kept-alive
    # connection's requests cost no timer calls (each loop timer made and cancelled is a few thousand instructions
    # under uvloop: docs/speed.md). `_due` None: no limit runs.
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
        self._idle = False

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
        if self._idle:  # idle past timeout_keep_alive: closed without a word, as uvicorn does
            self._idle = False
            self.transport.close()
            return
        cycle = self.cycle
        if self.pipeline or (cycle is not None and not cycle.response_complete and cycle.response_started):
            self.transport.close()  # an answer is already on its way: nothing else can be said
            return
        which = "body" if self._head_done else "headers"
        limit = self.limits.body_timeout if self._head_done else self.limits.header_timeout
        self._refuse(408, f"The request's {which} did not arrive within {limit:g} s.")

    def _refuse(self, status: int, message: str, linger: bool = True) -> None:
        """Answer with the OpenAI error envelope and close (the connection's state cannot be trusted any more)."""
        self._refused = True
        self._disarm()
        if self.transport.is_closing():
            return
        body = ProxyError(message, status, code=_CODES.get(status)).body()
        head = [_STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:  # `date`: a server with a clock sends it (RFC 9110 6.6.1)
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: application/json\r\n", b"content-length: %d\r\n" % len(body),
                 b"connection: close\r\n"]
        if status == 503:
            head.append(b"retry-after: 1\r\n")
        if 400 <= status < 500 and status != 408:
            head.append(b"x-should-retry: false\r\n")
        self.transport.write(b"".join(head) + b"\r\n" + body)
        # Lingering close: closing a socket with unread input makes the kernel send a reset, which can destroy the
        # answer before the client reads it. So: end our side, discard what still comes, close after a moment.
        if linger and self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(_LINGER, self.transport.close)
        else:
            self.transport.close()


_LINGER: Final = 2.0  # seconds a refused connection is still read (and discarded) before it is closed

_CODES: Final = {400: "invalid_request", 408: "request_timeout", 431: "request_header_fields_too_large",
                 503: "too_many_connections"}


class _ServerLines:
    """The server's own headers (uvicorn's `date`, a new list each second) as the header lines they make: checked
    and joined once per list, not with every answer."""

    __slots__ = ("headers", "lines")

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] | None = None
        self.lines = b""


_server_lines: Final = _ServerLines()


class Cycle:
    """One request and its answer: the ASGI app's `receive` and `send`, and the task that runs the app (`run_asgi`).
    The answer's status line and headers are held (`_head`) and written with its first body bytes."""

    def __init__(self, conn: GuardedHttpToolsProtocol, scope: dict[str, Any], head_only: bool,
                 expect_100_continue: bool, keep_alive: bool) -> None:
        self.conn: GuardedHttpToolsProtocol | None = conn  # dropped when the app is done: no reference cycle
        self.scope = scope
        self.transport: Any = conn.transport
        self.default_headers: list[tuple[bytes, bytes]] = conn.server_state.default_headers
        self.head_only = head_only  # a HEAD request: the answer's head alone
        # The connection
        self.disconnected = False
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = expect_100_continue
        # The request's body
        self.body = bytearray()
        self.more_body = True
        self._ready = False  # body bytes, the body's end or a disconnect came since `receive` last looked
        self._waiters: list[asyncio.Future[None]] = []
        # The answer
        self.response_started = False
        self.response_complete = False
        self.chunked: bool | None = None
        self.expected_length = 0
        self._head: bytes | None = None

    def wake(self) -> None:
        """Something for `receive` (asyncio.Event.set, without the Event)."""
        self._ready = True
        waiters = self._waiters
        if waiters:
            self._waiters = []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def run_asgi(self, app: Any) -> None:
        try:
            result = await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            _logger.error("Exception in ASGI application\n", exc_info=exc)
            if not self.response_started:
                await self._send_500()
            else:
                self._close()
        else:
            if result is not None:
                _logger.error("ASGI callable should return None, but returned '%s'.", result)
                self._close()
            elif not self.response_started and not self.disconnected:
                _logger.error("ASGI callable returned without starting response.")
                await self._send_500()
            elif not self.response_complete and not self.disconnected:
                _logger.error("ASGI callable returned without completing response.")
                self._close()
        finally:
            self.conn = None

    async def _send_500(self) -> None:
        await self.send({"type": "http.response.start", "status": 500,
                         "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"21"),
                                     (b"connection", b"close")]})
        await self.send({"type": "http.response.body", "body": b"Internal Server Error", "more_body": False})

    def _close(self) -> None:
        """Close the connection, after the held head if there is one (the client sees an answer cut short)."""
        head = self._head
        if head is not None:
            self._head = None
            self.transport.write(head)
        self.transport.close()

    async def send(self, message: dict[str, Any]) -> None:
        conn = self.conn
        if conn is not None and conn.write_paused and not self.disconnected:
            await conn.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got '{kind}'.")
            self.response_started = True
            self.waiting_for_100_continue = False
            self._start(message["status"], message.get("headers", ()))
        elif not self.response_complete:
            if kind != "http.response.body":
                raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{kind}'.")
            raw: Any = message.get("body", b"")
            more_body = bool(message.get("more_body", False))
            self._write_body(raw if type(raw) is bytes else bytes(raw), more_body)  # any bytes-like, as uvicorn
            if not more_body:
                self._complete(conn)
        else:
            raise RuntimeError(f"Unexpected ASGI message '{kind}' sent, after response already completed.")

    def _write_body(self, body: bytes, more_body: bool) -> None:
        """One body message on the wire, framed (chunked, or counted against Content-Length), after the held head."""
        data, pieces = self._frame(body, more_body)
        head = self._head
        if head is not None:
            self._head = None
            if pieces is None:
                data = head + data
            else:
                pieces.insert(0, head)
        if pieces is not None:
            self.transport.writelines(pieces)
        elif data:
            self.transport.write(data)

    def _frame(self, body: bytes, more_body: bool) -> tuple[bytes, list[bytes] | None]:
        """The bytes of one body message: one string, or (a large chunk) pieces written without a copy."""
        if self.head_only:
            self.expected_length = 0
            return b"", None
        if not self.chunked:
            size = len(body)
            if size > self.expected_length:
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_length -= size
            return body, None
        if not body:
            return (b"" if more_body else b"0\r\n\r\n"), None
        size = len(body)
        end = b"\r\n" if more_body else b"\r\n0\r\n\r\n"
        if size >= _SCATTER:
            return b"", [b"%x\r\n" % size, body, end]
        opening = _chunk_heads[size]
        if opening is None:
            opening = _chunk_heads[size] = b"%x\r\n" % size
        return b"%b%b%b" % (opening, body, end), None

    def _complete(self, conn: GuardedHttpToolsProtocol | None) -> None:
        """The last body message was written: the answer is complete."""
        if self.expected_length != 0:
            raise RuntimeError("Response content shorter than Content-Length")
        self.response_complete = True
        self.wake()
        if not self.keep_alive:
            self.transport.close()
        if conn is not None:
            conn.on_response_complete()

    def _start(self, status: int, headers: Any) -> None:
        """The answer's head, checked as uvicorn's protocol checks it, held for the first body bytes: the server's
        own headers (`date`), then the app's. `headers`: (name, value) pairs of bytes-like objects, tuples or lists
        (ASGI says iterables)."""
        content = [_STATUS_LINE[status]]
        server = self.default_headers
        known = _server_lines
        if server is known.headers:
            content.append(known.lines)
            closing = False
        else:
            closing = self._lines(server, content)
            if self.chunked is None and self.keep_alive and not closing:  # nothing the answer depends on
                known.headers = server
                known.lines = b"".join(content[1:])
        if self._lines(headers, content):
            closing = True
        if not self.keep_alive and not closing:
            content.append(b"connection: close\r\n")
        if self.chunked is None and not self.head_only and status != 204 and status != 304:
            self.chunked = True  # neither a length nor an encoding given
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        self._head = b"".join(content)

    def _lines(self, headers: Any, content: list[bytes]) -> bool:
        """`headers` checked and appended to `content` as header lines; the ones the answer's framing depends on
        taken note of. True if one says `connection: close`."""
        closing = False
        for raw_name, raw_value in headers:
            name = _header_name(raw_name if type(raw_name) is bytes else bytes(raw_name))
            value: bytes = raw_value if type(raw_value) is bytes else bytes(raw_value)
            if value.translate(_VALUE_OK) is not value and _bad_value(value) is not None:
                raise RuntimeError("Invalid HTTP header value.")
            if name == b"content-length" and self.chunked is None:
                self.expected_length = int(value.decode())
                self.chunked = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_length = 0
                self.chunked = True
            elif name == b"connection":
                if b"close" in [token.lower().strip() for token in value.split(b",")]:
                    self.keep_alive = False
                    closing = True
            content.append(name)
            content.append(b": ")
            content.append(value)
            content.append(b"\r\n")
        return closing

    async def receive(self) -> dict[str, Any]:
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.waiting_for_100_continue = False
        if not self.disconnected and not self.response_complete:
            conn = self.conn
            if conn is not None:
                conn.resume_reading()
            if not self._ready:
                waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                await waiter
            self._ready = False
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        message = {"type": "http.request", "body": bytes(self.body), "more_body": self.more_body}
        self.body = bytearray()
        return message
