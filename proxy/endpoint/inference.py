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
import logging
import time
from typing import TYPE_CHECKING, Any, Final

import orjson

from proxy.endpoint.passthrough import NATIVE, Passthrough
from proxy.endpoint.request import (
    SSE_HEADERS,
    ClientGone,
    Disconnect,
    Scope,
    parse_body,
    read_request_body,
    response_random,
    scan_headers,
    send_json,
    take_request_id,
)
from proxy.errors import (
    ClientRequestError,
    ProxyError,
    StreamTruncated,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from proxy.gateway.upstream import StreamReads, read_body, release
from proxy.hub import continuity
from proxy.hub.canonical import RequestContext
from proxy.hub.events import Answer, Delta, TextRun
from proxy.hub.pipeline import Pipeline

if TYPE_CHECKING:
    from proxy.clients.base import ClientCall, ClientDialect, Encoder
    from proxy.metrics.observer import RequestObserver
    from proxy.metrics.tracing import Output, RequestTrace
    from proxy.server.appstate import AppState

log: Final = logging.getLogger("dialect_proxy")
access_log: Final = logging.getLogger("dialect_proxy.access")
# Functions of other modules called per request, as statics (compiled: no module attribute looked up per call)
_clock: Final = time.perf_counter
_wall_clock: Final = time.time
_dumps: Final = orjson.dumps

CHAT_MODELS: Final = "chat"  # the kind of model (proxy/gateway/routing.py) every client dialect here asks for
KEY_NAME_SCOPE: Final = "dialect_proxy.key_name"  # set by proxy.server.asgi.ProxyApp: the name of the inbound key used


class InferenceEndpoint:
    """POST on a client dialect's path (proxy/clients): /v1/chat/completions, /v1/completions, /v1/responses ..."""

    def __init__(self, state: AppState, client: ClientDialect) -> None:
        self.state = state
        self.client = client
        self.route = client.path
        # Native passthrough (proxy/endpoint/passthrough.py): None unless an upstream takes this client dialect as it
        # is.
        self.native = Passthrough.create(state, client)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        state = self.state
        client = self.client
        started = _clock()
        rid_raw, length = scan_headers(scope["headers"])
        request_id, rid_bytes = take_request_id(rid_raw)
        rid_header = (b"x-request-id", rid_bytes)
        info: dict[str, Any] = {"request_id": request_id, "route": self.route}
        key_name = scope.get(KEY_NAME_SCOPE)
        if key_name:
            info["key"] = key_name
        obs: RequestObserver | None = None
        status = 500
        watch: Disconnect | None = None
        telemetry = state.telemetry  # OpenTelemetry (proxy/metrics/tracing.py): None unless configured
        trace = None if telemetry is None else telemetry.request(scope, self.route, started, info)
        try:
            try:
                body = await read_request_body(length, receive, state.settings.server.max_body_bytes)
                if state.shutting_down:
                    raise ProxyError("The proxy is shutting down.", 503, code="shutting_down")
                request = parse_body(body)
                native = self.native
                call = None if native is None else native.call(request, body, scope["headers"])
                if call is None:
                    call = await client.decode(request)
                ctx = self._context(call, request_id)
                info.update(upstream=ctx.upstream.name, model=ctx.client_model, stream=ctx.stream)
                obs = state.metrics.request(
                    self.route, ctx.upstream.name, ctx.client_model, ctx.stream, started_at=started, key=key_name
                )
                if trace is not None:
                    trace.routed(call, ctx, state.dialects[ctx.upstream.name].name, obs.model)
                watch = Disconnect(receive, scope)
                if native is not None and NATIVE in call.options:
                    status = await native.serve(call, ctx, send, watch, obs, rid_header, info, trace)
                else:
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
                status = await self._fail(send, err, watch, rid_header)
            except ClientGone:
                info["client_disconnected"] = True
                status = 499
            except Exception:  # a bug of ours: the client still gets an error in its dialect, never a stack trace
                log.exception("unexpected error in %s (request %s)", self.route, request_id)
                status = 500
                info["error"] = "internal_error"
                bug = ProxyError("Internal error in the proxy.", 500, type="server_error", code="internal_error")
                if watch is None or not watch.complete:
                    await self._fail(send, bug, watch, rid_header)
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
                    await self._fail(send, drain_err, watch, rid_header)
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

    async def _fail(self, send: Any, err: ProxyError, watch: Disconnect | None, rid_header: tuple[bytes, bytes]) -> int:
        """Tell the client about `err` in its dialect: the error event that ends a stream already under way, else an
        error response. The status the client got (a stream under way keeps its 200)."""
        if watch is not None and watch.committed and watch.encoder is not None:
            await send({"type": "http.response.body", "body": watch.encoder.error(err), "more_body": False})
            return 200
        status, headers, body = self.client.error_response(err)
        await send_json(send, status, body, headers + [rid_header])
        return status

    def _context(self, call: ClientCall, request_id: str) -> RequestContext:
        route = self.state.router.resolve_kind(call.model, CHAT_MODELS)  # a chat request, whatever its dialect
        return RequestContext(
            kind=call.kind,
            request_id=request_id,
            client_model=call.model,
            upstream_model=route.upstream_model,
            upstream=route.upstream,
            stream=call.stream,
            response_id=self.client.id_prefix + response_random.hex(12),
            created=int(_wall_clock()),
        )

    async def _serve(
        self,
        call: ClientCall,
        ctx: RequestContext,
        send: Any,
        watch: Disconnect,
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
        # buffer however short the body (docs/speed.md), and the dict goes.
        payload = bytes(memoryview(_dumps(upstream_body)))
        del upstream_body
        loop = watch.loop
        deadline = loop.time() + server.total_timeout
        obs.upstream_started()
        # Replicas (proxy/gateway/replicas.py): a pre-header failure (refused, reset, timeout, HTTP 502/503) may go to
        # another replica. Nothing has been sent to the client yet; the 200 is committed only later, in _relay.
        attempts = state.replicas[upstream.name].attempts(call.request, info)
        ticket, resp = await attempts.open(ctx, path, payload, dialect.request_headers, deadline, loop, trace)
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
                    raise dialect.errors.answer(resp.status, raw, {k.lower(): v for k, v in resp.headers.items()},
                                                path, upstream.name, upstream.dialect)
                if ctx.stream:
                    try:
                        data = orjson.loads(raw)
                    except orjson.JSONDecodeError:
                        data = None
                    err = dialect.errors.in_json(data)
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
        watch: Disconnect,
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

