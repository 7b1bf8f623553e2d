"""Thin aiohttp calls to upstreams: one pooled ClientSession per upstream, deadlines, failures classified.

aiohttp was chosen by measurement (several times less CPU per relayed chunk than httpx: docs/speed.md). Its
`ClientTimeout.total` stays None so long generations are not cut; the proxy enforces its own deadlines
(docs/decisions.md "Timeouts"): connect (aiohttp `sock_connect`), response headers (`first_byte_timeout`), silence
between chunks (`idle_timeout`, applied by the reader), whole request (`total_timeout`).

Client libraries blur failures; we classify them: refused / reset / DNS -> 502 `UpstreamUnreachable`,
connect or first-byte timeout -> 504 `UpstreamTimeout`.

A pooled keep-alive connection can be closed by the upstream (its idle timeout: 5 s for uvicorn) just as a request
goes out on it. aiohttp resends only idempotent methods then, and every request here is a POST: `open` sends it again
(at most `_STALE_RETRIES` times) when a connection that had served a request before broke before the answer's
headers, as Go's net/http does for a closed idle connection; the next try takes another pooled connection or a new
one. A new connection that breaks is a failure (failover's business, proxy/gateway/replicas.py).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any, Final

import aiohttp
import orjson

from proxy import __version__
from proxy.errors import ProxyError, StreamTruncated, UpstreamTimeout, UpstreamUnreachable
from proxy.gateway.redact import Redactor
from proxy.settings import ServerSettings, UpstreamSettings, redact_url

_READ_SIZE: Final = 2**16
_STALE_RETRIES: Final = 3  # pooled connections found closed under one request before the last try (see the docstring)
# The headers of every upstream request, as the session's defaults (each header passed per request is copied and
# merged by aiohttp): the proxy's name (not aiohttp's "Python/3.x aiohttp/3.x"; the `skip_auto_headers` this
# replaced cost a multidict built and merged per request), and JSON both ways. A stream request asks for
# text/event-stream instead (proxy/endpoint/inference.py); a GET carries no body, so its Content-Type says nothing.
USER_AGENT: Final = f"dialect-proxy/{__version__}"
_DEFAULT_HEADERS: Final = {"User-Agent": USER_AGENT, "Content-Type": "application/json", "Accept": "application/json"}
log: Final = logging.getLogger("dialect_proxy")
# Called per request, as statics (compiled: no module attribute looked up per call)
_current_task: Final = asyncio.current_task
_running_loop: Final = asyncio.get_running_loop


# Whether the request this task is sending went out on a new connection: set by _Connector when it opens one, read
# and cleared by UpstreamClient.open. Nothing is done for a pooled connection, the common case.
_new_connection: Final[ContextVar[bool]] = ContextVar("dialect_proxy_new_connection", default=False)


class _Connector(aiohttp.TCPConnector):
    """aiohttp's connection pool, saying (in `_new_connection`) that the connection it hands out is a new one.
    `_create_connection` is aiohttp's own step for opening one (not public API: should it be renamed, every
    connection would look pooled, which tests/hostile/test_stale_connections.py catches). Marking handed-out
    connections in `connect` instead would run on every request, pooled connection or new."""

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> Any:
        _new_connection.set(True)
        return await super()._create_connection(req, traces, timeout)


class UpstreamClient:
    """The connection pool of one upstream replica (proxy/gateway/replicas.py); `replica` names it in messages."""

    def __init__(self, upstream: UpstreamSettings, server: ServerSettings, redactor: Redactor | None = None,
                 replica: str | None = None) -> None:
        self.upstream = upstream
        self.server = server
        self.redactor = redactor or Redactor([upstream.api_key or ""])
        self.what = f"`{upstream.name}`" + ("" if replica is None else f" (replica `{replica}`)")
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = _Connector(
                ssl=tls_context(self.upstream),
                limit=self.upstream.max_connections,
                limit_per_host=self.upstream.max_connections,
                ttl_dns_cache=300,
                family=socket.AF_UNSPEC,
                enable_cleanup_closed=False,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=None, sock_connect=self.server.connect_timeout, sock_read=None
                ),
                auto_decompress=True,
                # One pool serves every client: a cookie set in an answer to one must not go out with the requests of
                # the others (tests/hostile/test_hostile_upstreams.py).
                cookie_jar=aiohttp.DummyCookieJar(),
                headers=_DEFAULT_HEADERS,
                json_serialize=None,  # type: ignore[arg-type]
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def open(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> aiohttp.ClientResponse:
        """Send the request and wait for the response headers (at most `timeout`, default first_byte_timeout).
        `loop`: the running loop, when the caller has it at hand (looking it up is a system call on Python 3.11)."""
        limit = self.server.first_byte_timeout if timeout is None else timeout
        if loop is None:
            loop = _running_loop()
        session = self.session
        try:
            async with asyncio.timeout_at(loop.time() + limit):
                for _ in range(_STALE_RETRIES):
                    if _new_connection.get():
                        _new_connection.set(False)
                    try:
                        return await session.request(method, url, data=body, headers=headers, allow_redirects=False)
                    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
                        if isinstance(e, aiohttp.ClientConnectorError) or _new_connection.get():
                            raise
                        log.debug(orjson.dumps({"event": "upstream_stale_connection", "upstream": self.upstream.name,
                                                "url": redact_url(url),
                                                "reason": self.redactor.secrets(_reason(e))}).decode())
                # Closed pooled connections every time: the next one comes from the pool too, or is new.
                return await session.request(method, url, data=body, headers=headers, allow_redirects=False)
        except aiohttp.ConnectionTimeoutError:
            raise UpstreamTimeout(
                f"Connecting to the upstream {self.what} timed out after "
                f"{self.server.connect_timeout:g} s."
            ) from None
        except aiohttp.ClientConnectorError as e:
            raise self._unreachable(url, e, f"could not be reached ({_kind(e)})") from None
        except aiohttp.ServerDisconnectedError as e:
            raise self._unreachable(url, e, "closed the connection without answering") from None
        except aiohttp.ClientError as e:
            raise self._unreachable(url, e, f"failed ({_kind(e)})") from None
        except TimeoutError:  # asyncio.timeout_at's (aiohttp's own timeouts are ClientErrors, above)
            raise UpstreamTimeout(f"The upstream {self.what} sent no response within {limit:g} s.") from None

    def _unreachable(self, url: str, e: BaseException, what: str) -> UpstreamUnreachable:
        """The client's error names the upstream and the kind of failure; its address and the full reason go to the
        log only (README "Errors")."""
        log.warning(orjson.dumps({"event": "upstream_unreachable", "upstream": self.upstream.name,
                                  "url": redact_url(url), "reason": self.redactor.secrets(_reason(e))}).decode())
        return UpstreamUnreachable(f"The upstream {self.what} {what}.{self._hint(url, e)}")

    def _hint(self, url: str, e: BaseException) -> str:
        hint = connection_hint(url, e, bool(self.upstream.tls_cert_file))
        return f" {hint[0].upper()}{hint[1:]}." if hint else ""


def connection_hint(url: str, e: BaseException, client_cert: bool) -> str | None:
    """The setting to change for a TLS mistake, or None. Resets are ambiguous, so those hints say "if"."""
    https = url.startswith("https://")
    if isinstance(e, aiohttp.ClientConnectorCertificateError):
        return ("the upstream's TLS certificate is not trusted: set tls_ca_file to the CA that signed it "
                "(tls_verify: false accepts any certificate, for testing only)")
    text = _reason(e).lower()
    if isinstance(e, aiohttp.ClientSSLError) or isinstance(getattr(e, "os_error", None), ssl.SSLError):
        if https and ("wrong version number" in text or "record layer failure" in text or "packet length" in text):
            return "the upstream does not speak TLS on this port: use an http:// URL"
        if "certificate required" in text or "handshake failure" in text or "bad certificate" in text \
                or "unknown ca" in text:
            return ("the upstream refused the TLS handshake, most likely for want of a client certificate it "
                    "trusts (mutual TLS): set tls_cert_file and tls_key_file")
        return None
    if isinstance(e, aiohttp.ClientConnectorError):  # refused, DNS, unreachable: not a TLS matter
        return None
    reset = isinstance(e, aiohttp.ServerDisconnectedError) or "reset by peer" in text or "broken pipe" in text
    if reset and not https:
        return ("if the upstream serves https (MindIE with httpsEnabled: true), use an https:// URL with "
                "tls_ca_file")
    if reset and https and not client_cert:
        return ("if the upstream requires mutual TLS (MindIE with httpsEnabled: true), set tls_cert_file and "
                "tls_key_file")
    return None


def tls_context(upstream: UpstreamSettings) -> ssl.SSLContext | bool:
    """The SSL context for an upstream: system CAs (or `tls_ca_file`), an optional client certificate for mutual
    TLS, or no verification at all when `tls_verify` is false. True = aiohttp's default."""
    u = upstream
    if not (u.tls_ca_file or u.tls_cert_file or not u.tls_verify):
        return True
    ctx = ssl.create_default_context(cafile=u.tls_ca_file)
    if u.tls_cert_file and u.tls_key_file:
        ctx.load_cert_chain(u.tls_cert_file, u.tls_key_file)
    if not u.tls_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


async def read_body(
    resp: aiohttp.ClientResponse, timeout: float, limit: int = 64 * 2**20, *, idle: float | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
) -> bytes:
    """A whole (non-stream) body, bounded in size, in time (`timeout` for all of it: what is left of the request's
    total_timeout) and, with `idle`, in silence between two reads (idle_timeout), as for streams. `loop`: as for
    `UpstreamClient.open`."""
    content = resp.content
    if content.is_eof():  # the whole body came with the head (a short answer): no deadline to arm, no read to await
        try:
            data = content.read_nowait()
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
            raise ProxyError(_CUT_SHORT, 502) from None
        if len(data) > limit:
            raise ProxyError(_TOO_LARGE, 502)
        return data
    if loop is None:
        loop = _running_loop()
    deadline = loop.time() + timeout
    try:
        async with asyncio.timeout_at(deadline if idle is None else min(deadline, loop.time() + idle)) as limits:
            chunks = []
            size = 0
            while True:
                data = await content.read(_READ_SIZE)
                if not data:
                    break
                if idle is not None:
                    limits.reschedule(min(deadline, loop.time() + idle))
                size += len(data)
                if size > limit:
                    raise ProxyError(_TOO_LARGE, 502)
                chunks.append(data)
                if content.at_eof():  # the whole body is in (the usual case: one read), no read for the end
                    break
            return b"".join(chunks)
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
        raise ProxyError(_CUT_SHORT, 502) from None
    except TimeoutError:  # asyncio.timeout_at's (aiohttp's own read timeouts are ClientConnectionErrors, above)
        if loop.time() >= deadline:
            raise UpstreamTimeout(f"The upstream's answer did not arrive within {timeout:g} s.") from None
        raise UpstreamTimeout(f"The upstream sent nothing for {idle:g} s.") from None


_TOO_LARGE: Final = "The upstream's answer is larger than the proxy accepts."
_CUT_SHORT: Final = "The upstream closed the connection in the middle of its answer."


_TICK: Final = "dialect-proxy: upstream silent"


class StreamReads:
    """Raw bytes of a streamed body as they arrive: `await read()` gives the next bytes, None after each `keepalive`
    seconds of silence (so the caller can send an SSE comment), b"" at the end; it raises StreamTruncated on idle
    timeout, total deadline or a broken body. `close()` (always, in a `finally`) ends its timer.

    Deadlines cost nothing per chunk: instead of arming a timeout around every read, one timer (`_tick`) looks at
    the time of the last read and cancels the reading task (with _TICK) only when the upstream really was silent past
    a limit. It never interrupts the caller while the caller is busy sending (a slow client is back-pressure, not
    upstream silence). The timer holds `_tick`, bound to this object: `close()` cancels and drops it, so no reference
    cycle is left behind. A class, not an async generator, so that it compiles with the request path (setup.py).
    """

    __slots__ = ("_content", "_deadline", "_fired", "_handle", "_idle", "_keepalive", "_last_data", "_last_tick",
                 "_loop", "_reading", "_rearm", "_task")

    def __init__(self, resp: aiohttp.ClientResponse, idle_timeout: float, keepalive: float, deadline: float,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop = _running_loop() if loop is None else loop  # (as for UpstreamClient.open)
        task = _current_task(loop)
        assert task is not None
        self._task: asyncio.Task[Any] = task
        self._content = resp.content
        self._idle = idle_timeout
        self._keepalive = keepalive
        self._deadline = deadline
        self._last_data = self._last_tick = loop.time()
        self._reading = False  # awaiting the upstream: only then may the timer interrupt
        self._fired = False  # the timer cancelled the read
        self._rearm = False  # a keep-alive was given: the timer starts again at the next read
        self._handle: asyncio.TimerHandle | None = loop.call_at(self._next_due(), self._tick)

    async def read(self) -> bytes | None:
        if self._rearm:
            self._rearm = False
            self._handle = self._loop.call_at(self._next_due(), self._tick)
        self._reading = True
        try:
            data = await self._content.readany()
        except asyncio.CancelledError as e:
            if not (self._fired and e.args == (_TICK,)):
                raise
            self._fired = False
            if self._task.uncancel() > 0:  # someone else (client disconnect, shutdown) cancelled us too
                raise
            now = self._loop.time()
            if now >= self._deadline:
                raise StreamTruncated("The request exceeded the proxy's total time limit.",
                                      reason="idle_timeout", status=504) from None
            if now - self._last_data >= self._idle:
                raise StreamTruncated(f"The upstream sent nothing for {self._idle:g} s.",
                                      reason="idle_timeout", status=504) from None
            self._last_tick = now
            self._rearm = True
            return None
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
            raise StreamTruncated(
                "The upstream connection broke in the middle of the stream.", reason="upstream_closed"
            ) from None
        finally:
            self._reading = False
        if data:
            self._last_data = self._loop.time()
        return data

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _next_due(self) -> float:
        return min(max(self._last_data, self._last_tick) + self._keepalive, self._last_data + self._idle,
                   self._deadline)

    def _tick(self) -> None:
        now = self._loop.time()
        due = self._next_due()
        if now >= due:
            if self._reading:
                self._fired = True
                self._task.cancel(msg=_TICK)
                return
            due = now + min(self._keepalive, 1.0)  # the caller is busy sending to a slow client: look again soon
        self._handle = self._loop.call_at(due, self._tick)


async def release(resp: aiohttp.ClientResponse, drain_timeout: float = 1.0) -> None:
    """Give a finished response's connection back to the pool (keep-alive to the upstream), after reading what is
    left of the body (the chunked terminator after `[DONE]`) for at most `drain_timeout`; otherwise close it."""
    if not resp.content.is_eof():
        try:
            async with asyncio.timeout(drain_timeout):
                size = 0
                while data := await resp.content.readany():
                    size += len(data)
                    if size > 2**16:  # an upstream that keeps talking after the end: not worth keeping
                        break
        except (TimeoutError, aiohttp.ClientError):
            pass
    if resp.content.is_eof():
        resp.release()
    else:
        resp.close()


_ERRNO_KINDS: Final = {
    errno.ECONNREFUSED: "connection refused",
    errno.ECONNRESET: "connection reset",
    errno.EHOSTUNREACH: "host unreachable",
    errno.ENETUNREACH: "network unreachable",
    errno.ETIMEDOUT: "timed out",
}


def _kind(e: BaseException) -> str:
    """What went wrong, in words that carry no address."""
    if isinstance(e, aiohttp.ClientConnectorCertificateError):
        return "TLS certificate not trusted"
    if isinstance(e, aiohttp.ClientSSLError) or isinstance(getattr(e, "os_error", None), ssl.SSLError):
        return "TLS handshake failed"
    if isinstance(e, aiohttp.ClientConnectorDNSError) or isinstance(getattr(e, "os_error", None), socket.gaierror):
        return "host name not resolved"
    os_error = getattr(e, "os_error", None)
    if isinstance(os_error, OSError) and os_error.errno in _ERRNO_KINDS:
        return _ERRNO_KINDS[os_error.errno]
    text = _reason(e).lower()
    for words in ("connection refused", "connection reset", "broken pipe", "timed out"):
        if words in text:
            return words
    return type(e).__name__


def _reason(e: BaseException) -> str:
    os_error = getattr(e, "os_error", None)
    if isinstance(os_error, OSError) and os_error.strerror:
        return os_error.strerror
    text = str(e)
    return text[:200] if text else type(e).__name__
