"""The inference endpoint: glue only — client spoke decodes, route, upstream session builds, send, pipeline turns
the answer into hub events, client spoke encodes, respond. One class serves every client dialect (proxy/clients).

The inference endpoints are raw ASGI callables (not Starlette Request/Response) because they own two things the
framework does not do for us:
- cancellation: a watcher task reads `http.disconnect` and cancels the request's task, so the upstream request is
  closed at once — while waiting for response headers, while reading a non-stream body, and mid-stream;
- the stream relay: upstream bytes -> pipeline (proxy/hub/pipeline.py) -> hub events -> client encoder -> bytes, reading
  upstream only as fast as the client takes it (uvicorn's `send` waits while the socket's write buffer is full).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import re
import time
from typing import TYPE_CHECKING, Any, Final

import orjson

from proxy.clients.validate import check_depth
from proxy.errors import (
    ClientRequestError,
    ProxyError,
    StreamTruncated,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from proxy.gateway.replicas import RETRY_STATUSES
from proxy.gateway.upstream import StreamReads, read_body, release
from proxy.hub import continuity
from proxy.hub.canonical import RequestContext
from proxy.hub.events import Answer, Delta, TextRun
from proxy.hub.pipeline import Pipeline
from proxy.server.frontend import DISCONNECT_HOOK

if TYPE_CHECKING:
    from proxy.clients.base import ClientCall, ClientDialect, Encoder
    from proxy.metrics.prometheus import RequestObserver
    from proxy.metrics.tracing import Output, RequestTrace
    from proxy.server.appstate import AppState

log: Final = logging.getLogger("dialect_proxy")
access_log: Final = logging.getLogger("dialect_proxy.access")
# Functions of other modules called per request, as statics (compiled: no module attribute looked up per call,
# ~270 instructions each)
_clock: Final = time.perf_counter
_current_task: Final = asyncio.current_task
_ensure_future: Final = asyncio.ensure_future
_running_loop: Final = asyncio.get_running_loop
_urandom: Final = os.urandom
_wall_clock: Final = time.time
_dumps: Final = orjson.dumps
_loads: Final = orjson.loads

Scope = dict[str, Any]
JSON_HEADERS: Final = [(b"content-type", b"application/json")]
KEY_NAME_SCOPE: Final = "dialect_proxy.key_name"  # set by proxy.server.asgi.ProxyApp: the name of the inbound key used
SSE_HEADERS: Final = [
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class _Disconnect:
    """Cancels the request's task when the client goes away. Under the proxy's own front end (proxy/server/frontend.py)
    the connection calls `_lost` directly; under any other server a watcher task reads `receive()` for
    `http.disconnect`."""

    __slots__ = ("_scope", "_task", "_watcher", "committed", "complete", "disconnected", "encoder", "loop")

    def __init__(self, receive: Any, scope: Scope) -> None:
        self.encoder: Encoder | None = None  # the client encoder, once the answer is being encoded
        self.disconnected = False
        self.complete = False  # set just before the final send: uvicorn then answers receive() with a disconnect
        self.committed = False  # the 200 event-stream head has been sent
        self._task = task = _current_task()
        # The request's loop, for the calls below that need one: taken from its task (asyncio.get_running_loop is a
        # getpid system call on Python 3.11, three a request saved).
        self.loop = task.get_loop() if task is not None else _running_loop()
        self._scope: Scope | None = None
        self._watcher: asyncio.Future[None] | None = None
        if DISCONNECT_HOOK in scope:
            scope[DISCONNECT_HOOK] = self._lost
            self._scope = scope
        else:
            self._watcher = _ensure_future(self._watch(receive))

    async def _watch(self, receive: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self._lost()
                return

    def _lost(self) -> None:
        if not self.complete and not self.disconnected and self._task is not None:
            self.disconnected = True
            self._task.cancel()

    def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        if self._scope is not None:
            self._scope[DISCONNECT_HOOK] = None


class _ClientGone(Exception):
    """The client went away before its request body was complete."""


def _scan_headers(headers: Any) -> tuple[bytes, bytes]:
    """The request's x-request-id and content-length (b"" for none), in one pass over its headers (as the ASGI
    server lists them: lower-case names): the first of each."""
    rid: bytes | None = None
    length: bytes | None = None
    for item in headers:
        key = item[0]  # an index, not an unpacking (compiled: no iterator per header)
        if key == b"x-request-id":
            if rid is None:
                rid = item[1]
                if length is not None:
                    break
        elif key == b"content-length" and length is None:
            length = item[1]
            if rid is not None:
                break
    return rid or b"", length or b""


async def _read_request_body(length: bytes, receive: Any, limit: int) -> bytes:
    """The request body (`length`: its content-length header, b"" for none), refused (413) beyond `limit`."""
    if length.isdigit() and int(length) > limit:
        raise ClientRequestError(
            f"The request body is {int(length)} bytes; the limit is {limit} bytes.", 413, code="request_too_large"
        )
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        body = message.get("body", b"")
        if body:
            size += len(body)
            if size > limit:
                raise ClientRequestError(
                    f"The request body is larger than the limit of {limit} bytes.", 413, code="request_too_large"
                )
            chunks.append(body)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def send_json(send: Any, status: int, payload: bytes, extra: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": JSON_HEADERS + extra})
    await send({"type": "http.response.body", "body": payload})


class InferenceEndpoint:
    """POST on a client dialect's path (proxy/clients): /v1/chat/completions, /v1/completions, /v1/responses ..."""

    def __init__(self, state: AppState, client: ClientDialect) -> None:
        self.state = state
        self.client = client
        self.route = client.path

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        state = self.state
        client = self.client
        started = _clock()
        rid_raw, length = _scan_headers(scope["headers"])
        request_id, rid_bytes = _request_id(rid_raw)
        rid_header = (b"x-request-id", rid_bytes)
        info: dict[str, Any] = {"request_id": request_id, "route": self.route}
        key_name = scope.get(KEY_NAME_SCOPE)
        if key_name:
            info["key"] = key_name
        obs: RequestObserver | None = None
        status = 500
        watch: _Disconnect | None = None
        telemetry = state.telemetry  # OpenTelemetry (proxy/metrics/tracing.py): None unless configured
        trace = None if telemetry is None else telemetry.request(scope, self.route, started, info)
        try:
            try:
                body = await _read_request_body(length, receive, state.settings.server.max_body_bytes)
                if state.shutting_down:
                    raise ProxyError("The proxy is shutting down.", 503, code="shutting_down")
                call = await client.decode(_parse(body))
                ctx = self._context(call, request_id)
                info.update(upstream=ctx.upstream.name, model=ctx.client_model, stream=ctx.stream)
                obs = state.metrics.request(
                    self.route, ctx.upstream.name, ctx.client_model, ctx.stream, started_at=started, key=key_name
                )
                if trace is not None:
                    trace.routed(call, ctx, state.dialects[ctx.upstream.name].name, obs.model)
                watch = _Disconnect(receive, scope)
                status = await self._serve(call, ctx, send, watch, obs, rid_header, info, trace)
            except ProxyError as err:
                state.redactor.sanitize(err)
                status = err.status
                info["error"] = err.code
                if obs is None:  # refused before routing (bad JSON, 413, unknown model): still counted
                    obs = state.metrics.request(
                        self.route,
                        info.get("upstream", ""),
                        info.get("model", ""),
                        bool(info.get("stream")),
                        started_at=started,
                        key=key_name,
                    )
                if obs is not None and isinstance(err, UpstreamError | UpstreamUnreachable | UpstreamTimeout):
                    obs.upstream_error(info.get("dialect", "any"), err.upstream_code or err.code)
                if watch is not None:
                    watch.complete = True
                err_status, err_headers, err_body = client.error_response(err)
                status = err_status
                await send_json(send, err_status, err_body, err_headers + [rid_header])
            except _ClientGone:
                info["client_disconnected"] = True
                status = 499
            except Exception:  # a bug of ours: the client still gets an error in its dialect, never a stack trace
                log.exception("unexpected error in %s (request %s)", self.route, request_id)
                status = 500
                info["error"] = "internal_error"
                bug = ProxyError("Internal error in the proxy.", 500, type="server_error", code="internal_error")
                if watch is None or not watch.complete:
                    if watch is not None and watch.committed and watch.encoder is not None:
                        await send({"type": "http.response.body", "body": watch.encoder.error(bug), "more_body": False})
                    else:
                        err_status, err_headers, err_body = client.error_response(bug)
                        await send_json(send, err_status, err_body, err_headers + [rid_header])
        except asyncio.CancelledError as cancelled:
            if watch is not None and watch.disconnected:
                _uncancel()
                info["client_disconnected"] = True
                status = 499
            elif watch is not None and _is_shutdown_cancel(cancelled):
                # The shutdown grace period is over: end the request with an error the client can see.
                _uncancel()
                drain_err = ProxyError(
                    "The proxy is shutting down; the request was cut at the end of the grace period.",
                    503,
                    code="shutting_down",
                )
                info["error"] = drain_err.code
                status = 503
                if obs is not None and watch.committed:
                    obs.truncated("shutdown")
                watch.complete = True
                with contextlib.suppress(Exception):
                    if watch.committed and watch.encoder is not None:
                        await send(
                            {"type": "http.response.body", "body": watch.encoder.error(drain_err), "more_body": False}
                        )
                    else:
                        err_status, err_headers, err_body = client.error_response(drain_err)
                        await send_json(send, err_status, err_body, err_headers + [rid_header])
            else:
                raise
        finally:
            if watch is not None:
                watch.stop()
            duration = _clock() - started
            disconnected = bool(info.get("client_disconnected"))
            if obs is not None:
                obs.finish(status, disconnected, info.get("finish_reason"), info.get("error"))
            if trace is not None:
                trace.finish(status, obs)
            if access_log.isEnabledFor(logging.INFO):
                info["status"] = status
                info["duration_ms"] = round(duration * 1000, 2)
                ttft = obs.ttft if obs is not None and info.get("stream") else None
                info["ttft_ms"] = None if ttft is None else round(ttft * 1000, 2)
                info["client_disconnected"] = disconnected
                access_log.info(_dumps(info).decode())

    def _context(self, call: ClientCall, request_id: str) -> RequestContext:
        route = self.state.router.resolve(call.model)
        return RequestContext(
            kind=call.kind,
            request_id=request_id,
            client_model=call.model,
            upstream_model=route.upstream_model,
            upstream=route.upstream,
            stream=call.stream,
            response_id=self.client.id_prefix + _response_random.hex(12),
            created=int(_wall_clock()),
        )

    async def _serve(
        self,
        call: ClientCall,
        ctx: RequestContext,
        send: Any,
        watch: _Disconnect,
        obs: RequestObserver,
        rid_header: tuple[bytes, bytes],
        info: dict[str, Any],
        trace: RequestTrace | None,
    ) -> int:
        state = self.state
        server = state.settings.server
        upstream = ctx.upstream
        dialect = state.dialects[upstream.name]
        info["dialect"] = dialect.name
        if call.options.get("log"):
            info.update(call.options["log"])
        path = dialect.path(ctx.kind)
        if path is None:
            raise ClientRequestError(
                f"The upstream `{upstream.name}` ({dialect.name}) has no {self.route} equivalent.",
                404,
                code="unsupported_endpoint",
            )
        if dialect.prepares:  # what the translation needs from the upstream first (DeepSeek: its model list, cached)
            await dialect.prepare(ctx)
        # Reasoning continuity: strip or restore reasoning on assistant turns; a recorder only when the mode needs it.
        recorder = await continuity.prepare(state.store, dialect, call.request, ctx, state.metrics)
        session = dialect.session(ctx)
        upstream_body = session.build_request(call.request)
        path = dialect.request_path(path, upstream_body, ctx)
        if server.log_bodies and log.isEnabledFor(logging.DEBUG):
            log.debug(
                orjson.dumps(
                    {
                        "request_id": ctx.request_id,
                        "client_body": redact(call.request),
                        "upstream_body": redact(upstream_body),
                    }
                ).decode()
            )
        # Held for the whole answer (a retry sends it again): a compact copy, as orjson's own result keeps a 4 KiB
        # buffer however short the body (measured with tracemalloc: 4 KiB per open stream), and the dict goes.
        payload = bytes(memoryview(_dumps(upstream_body)))
        del upstream_body
        loop = watch.loop
        deadline = loop.time() + server.total_timeout
        obs.upstream_started()
        # Replicas (proxy/gateway/replicas.py): a pre-header failure (refused, reset, timeout, HTTP 502/503) may go to
        # another replica. Nothing has been sent to the client yet; the 200 is committed only later, in _relay.
        attempts = state.replicas[upstream.name].attempts(call.request, info)
        while True:
            ticket = await attempts.next()
            # Per attempt: MindIE's req-id is unique per attempt. Content-Type and Accept (JSON) are the upstream
            # session's defaults (proxy/gateway/upstream.py).
            headers = dialect.request_headers(ctx)
            if ctx.stream:
                headers["Accept"] = "text/event-stream"
            if trace is not None:  # the attempt's CLIENT span; its traceparent goes upstream
                trace.attempt(ticket.replica, headers)
            time_left = deadline - loop.time()
            try:
                resp = await ticket.client.open("POST", ticket.url + path, body=payload, headers=headers,
                                                timeout=min(server.first_byte_timeout, max(time_left, 0.001)),
                                                loop=loop)
            except (UpstreamUnreachable, UpstreamTimeout) as failure:
                if trace is not None:
                    trace.attempt_failed(failure)
                if attempts.retry(ticket, failure, deadline - loop.time()):
                    ctx.attempt += 1
                    continue
                ticket.release()
                state.metrics.upstream_up(upstream.name, False)
                raise
            except BaseException:  # cancelled (the client left, shutdown): the slot is free again
                ticket.release()
                raise
            if resp.status in RETRY_STATUSES:
                if attempts.retry(ticket, resp.status, deadline - loop.time()):
                    if trace is not None:
                        trace.attempt_failed(resp.status)
                    resp.close()
                    ctx.attempt += 1
                    continue
            else:
                attempts.succeeded(ticket)
            break
        state.metrics.upstream_up(upstream.name, True)
        reusable = False
        try:
            answer = Answer()
            if trace is not None:
                trace.answering(resp.status, answer)
            encoder = self.client.encoder(call, ctx, answer)
            # Client encoders take the lane's runs as TextRuns; a continuity recorder reads Deltas.
            pipeline = Pipeline(session, answer, runs=recorder is None)
            extra_headers = call.headers + [rid_header]
            obs.upstream_headers()
            t_up = _clock()
            content_type = resp.headers.get("Content-Type", "")
            if not ctx.stream or resp.status >= 300 or "text/event-stream" not in content_type:
                raw = await read_body(resp, max(deadline - loop.time(), 0.001), idle=server.idle_timeout, loop=loop)
                obs.add_upstream_wait(_clock() - t_up)
                if resp.status >= 300:
                    raise dialect.answer_error(resp.status, raw, {k.lower(): v for k, v in resp.headers.items()},
                                               path, upstream.name, upstream.dialect)
                if ctx.stream:
                    try:
                        data = orjson.loads(raw)
                    except orjson.JSONDecodeError:
                        data = None
                    err = dialect.error_in_json(data)
                    raise err or UpstreamError("The upstream answered a stream request without an event stream.")
                events: list[Delta | TextRun] = []
                try:
                    pipeline.feed_body(raw, events)
                    pipeline.finish(events)
                finally:
                    self._observe(obs, session, answer, info)
                tap = None if trace is None else trace.output  # content capture (opt-in)
                if tap is not None:
                    tap.feed(events)
                info["finish_reason"] = answer.finish_reason
                obs.chunks(len(events), sum(1 for event in events if type(event) is Delta and event.has_token))
                if recorder is not None:
                    recorder.feed(events)  # type: ignore[arg-type]  # a whole body gives Deltas only
                encoder.feed(events)
                result = encoder.finish()
                if recorder is not None:
                    await recorder.save()
                await self.client.completed(call, encoder)
                watch.complete = True
                await send_json(send, 200, result, extra_headers)
                reusable = True
                return 200
            status = await self._relay(
                resp, call, pipeline, encoder, send, watch, obs, extra_headers, info, deadline, recorder,
                None if trace is None else trace.output,
            )
            reusable = status == 200
            return status
        finally:
            ticket.release()
            if reusable:  # the answer is complete: keep the connection for the next request
                await release(resp)
            else:  # an error or a client that left: close, so the upstream stops generating
                resp.close()

    async def _relay(
        self,
        resp: Any,
        call: ClientCall,
        pipeline: Pipeline,
        encoder: Encoder,
        send: Any,
        watch: _Disconnect,
        obs: RequestObserver,
        extra_headers: list[tuple[bytes, bytes]],
        info: dict[str, Any],
        deadline: float,
        recorder: continuity.Recorder | None = None,
        tap: Output | None = None,
    ) -> int:
        """Upstream event stream -> client event stream.

        The 200 head is sent lazily: with the first generated token (or finish), or when the first keep-alive is
        due. So an error that arrives as the stream's first event (a Siliconstorm `{"code": 701}` in an SSE line,
        MindIE's raw `Engine callback timeout` before any token) still reaches the client as an HTTP error status;
        only a failure after the head becomes the client dialect's in-stream error (never a clean end).
        """
        server = self.state.settings.server
        session = pipeline.session
        events: list[Delta | TextRun] = []  # TextRuns only without a recorder (Pipeline `runs`, _serve)
        pending: list[bytes] = []  # encoded but not yet sent: still sent when a later event fails
        substantive = False  # a token or a finish is pending or sent: worth committing the 200 for
        head = [(b"content-type", self.client.content_type), *SSE_HEADERS, *extra_headers]

        def encode() -> None:
            nonlocal substantive
            tokens = 0
            count = len(events)
            for event in events:
                if type(event) is TextRun:  # one event per text, each a token
                    tokens += len(event.texts)
                    count += len(event.texts) - 1
                elif event.content or event.reasoning or event.tool_calls:  # Delta.has_token, inlined (per event)
                    tokens += 1
                elif event.finish_reason is not None:
                    substantive = True
            if tokens:
                substantive = True
            obs.chunks(count, tokens)
            if recorder is not None:
                recorder.feed(events)  # type: ignore[arg-type]  # Deltas only: no runs with a recorder (_serve)
            if tap is not None:  # the answer's text for the trace (content capture: opt-in)
                tap.feed(events)
            data = encoder.feed(events)
            events.clear()
            if data:
                pending.append(data)

        async def flush(final: bytes = b"", more: bool = True) -> None:
            if not watch.committed:
                await send({"type": "http.response.start", "status": 200, "headers": head})
                watch.committed = True
                watch.encoder = encoder
                opening = encoder.head()
                if opening:  # (none for Chat Completions: the one part of a read is sent as it is, not copied)
                    pending.insert(0, opening)
            if final:
                pending.append(final)
            body = b"".join(pending)  # one part (a paced stream's chunk): that very object, no copy
            pending.clear()
            await send({"type": "http.response.body", "body": body, "more_body": more})

        try:
            reads = StreamReads(resp, server.idle_timeout, server.keepalive_interval, deadline, watch.loop)
            try:
                while True:
                    data = await reads.read()
                    if data is None:
                        await flush(encoder.keepalive)
                        continue
                    if not data:
                        break
                    pipeline.feed(data, events)
                    if events:
                        encode()
                    # Until the head is sent, role-only chunks wait for the first token (or finish), so that a
                    # failure before any generated text is still an HTTP error.
                    if pending and (watch.committed or pipeline.done or substantive):
                        await flush()
                    if pipeline.done:
                        break
            finally:
                reads.close()  # the silence timer ends as soon as we stop reading (e.g. right after [DONE])
            pipeline.finish(events)
            if events:
                encode()
            self._observe(obs, session, pipeline.answer, info)
            info["finish_reason"] = pipeline.answer.finish_reason
            tail = encoder.finish()
            if recorder is not None:
                await recorder.save()  # before the last bytes: a fast client's next turn must find it
            await self.client.completed(call, encoder)
            watch.complete = True
            await flush(tail, more=False)
            return 200
        except ProxyError as err:
            self.state.redactor.sanitize(err)
            if events:
                encode()  # what arrived before the failure is still delivered, ahead of the error
            reason = err.reason if isinstance(err, StreamTruncated) else "upstream_error"
            self._observe(obs, session, pipeline.answer, info)
            if not watch.committed and not substantive:
                raise  # nothing generated reached the client yet: it gets the HTTP status and envelope
            obs.truncated(reason)
            if err.upstream_code:
                obs.upstream_error(session.dialect.name, err.upstream_code)
            info["error"] = err.code
            info["truncated"] = reason
            watch.complete = True
            await flush(encoder.error(err), more=False)
            return max(err.status, 500)

    @staticmethod
    def _observe(obs: RequestObserver, session: Any, answer: Answer, info: dict[str, Any]) -> None:
        if answer.usage is not None:
            obs.usage(answer.usage)
            info["prompt_tokens"] = answer.usage.get("prompt_tokens")
            info["completion_tokens"] = answer.usage.get("completion_tokens")
        extras = {**answer.usage_extras, **session.extras}
        timings = session.dialect.timings(extras) if extras else None
        if timings is not None:
            obs.upstream_timings(timings)


_SECRET_KEYS: Final = ("authorization", "api_key", "apikey", "api-key", "password", "secret", "token")


def redact(value: Any) -> Any:
    """A copy of a JSON value with credential-looking fields replaced (for --log-bodies)."""
    if isinstance(value, dict):
        return {
            k: "[redacted]"
            if isinstance(k, str) and any(s in k.lower() for s in _SECRET_KEYS) and not k.endswith("_tokens")
            else redact(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def _uncancel() -> None:
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


# uvicorn cancels the tasks still running when its graceful-shutdown timeout (our --shutdown-grace) is over, with
# this message; proxy.server.process.ProxyServer uses the same one.
SHUTDOWN_CANCEL_MSG: Final = "graceful shutdown exceeded"


def _is_shutdown_cancel(exc: asyncio.CancelledError) -> bool:
    return any(isinstance(a, str) and SHUTDOWN_CANCEL_MSG in a for a in exc.args)


def _parse(body: bytes) -> dict[str, Any]:
    try:
        req = _loads(body)
    except orjson.JSONDecodeError as e:
        raise ClientRequestError(f"The request body is not valid JSON ({e}).", code="invalid_json") from None
    if not isinstance(req, dict):
        raise ClientRequestError("The request body must be a JSON object.", code="invalid_json")
    check_depth(req, size=len(body))  # before anything serialises it: orjson parses 1024 levels but serialises only 254
    return req


_CONTROL: Final = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


# Request ids the proxy makes: unique, not secret (they are logged and returned), so a random prefix per process and
# a counter (no system call per request). Response ids, which name stored responses, stay random (_context,
# RandomHex).
_ID_PREFIX: Final = os.urandom(8).hex()
_id_counter: Final = itertools.count(1)


class RandomHex:
    """Random hex text for ids, from the system's CSPRNG as `os.urandom(n).hex()`, but drawn `BATCH` bytes at a time:
    one getrandom system call per ~340 response ids instead of one per request. No byte is handed out twice, and a
    forked child starts with an empty pool (`forget`), so two processes never share one."""

    BATCH: Final = 4096

    __slots__ = ("_pool", "_pos")

    def __init__(self) -> None:
        self._pool = b""
        self._pos = 0

    def hex(self, size: int) -> str:
        pos = self._pos
        if pos + size > len(self._pool):
            self._pool = _urandom(max(self.BATCH, size))
            pos = 0
        self._pos = pos + size
        return self._pool[pos:pos + size].hex()

    def forget(self) -> None:
        self._pool = b""
        self._pos = 0


_response_random: Final = RandomHex()
os.register_at_fork(after_in_child=_response_random.forget)


def _new_request_id() -> str:
    # The counter in decimal: compiled, str() of an int is a C conversion, where a hex format spec is a generic
    # str.format call (~2,500 instructions, callgrind).
    return _ID_PREFIX + str(next(_id_counter))


def _request_id(raw: bytes) -> tuple[str, bytes]:
    """The client's x-request-id `raw` (or a new one, for b""): as text for logs and the upstream header, and as the
    bytes to return. Valid UTF-8 reaches the upstream byte for byte (aiohttp writes header text as UTF-8); other bytes
    as U+FFFD. Cut to 200 bytes (at a character boundary); control characters (which no header may carry) get a new
    id instead."""
    if not raw:
        rid = _new_request_id()
        return rid, rid.encode()
    if len(raw) > 200:
        cut = 200
        while cut > 196 and 0x80 <= raw[cut] < 0xC0:  # the cut falls inside a UTF-8 character: cut before it
            cut -= 1
        raw = raw[:cut]
    if not raw.strip() or _CONTROL.search(raw):
        rid = _new_request_id()
        return rid, rid.encode()
    return raw.decode("utf-8", "replace"), raw
