"""One exchange: a request of a client dialect, from its body to the end of its answer, whatever the transport that
brought it (an HTTP request: proxy/endpoint/inference.py; a WebSocket message: proxy/server/responses_socket.py).

    Inbound (the body, the headers, the disconnect watch)
      ─▶ the endpoint (`Endpoint.answer`): decode (client spoke) or take it as it is (passthrough) ─▶ route
         (`Exchange.routed`) ─▶ serve: translation (proxy/endpoint/translate.py), passthrough
         (proxy/endpoint/passthrough.py) or retrieval (proxy/endpoint/retrieval.py: embeddings, rerank)
      ─▶ the answer into the transport's Sink (proxy/endpoint/sink.py), through a Relay (proxy/endpoint/relay.py)
         or whole (`Sink.whole`)

Everything around it is here, once for every path and transport: the errors before the answer (the client
dialect's error, counted), a bug of ours (a 500 `internal_error`, never a stack trace to the client), the client
leaving (499), the end of the shutdown grace period (503, or the in-stream error of a stream under way), and at the
end the metrics, the trace and the access log line (proxy/endpoint/record.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any, Final, Protocol

import orjson

from proxy.endpoint.request import ClientGone, Disconnect
from proxy.errors import ProxyError, UpstreamError, UpstreamTimeout, UpstreamUnreachable
from proxy.gateway.admission import queue_as
from proxy.gateway.limits import LimitRefused
from proxy.gateway.upstream import read_body
from proxy.hub.canonical import CHAT, COMPLETIONS

if TYPE_CHECKING:
    from proxy.endpoint.record import AccessRecord
    from proxy.endpoint.relay import Relay
    from proxy.endpoint.sink import Sink
    from proxy.gateway.limits import Grant
    from proxy.hub.canonical import RequestContext
    from proxy.metrics.observer import RequestObserver
    from proxy.metrics.tracing import RequestTrace
    from proxy.server.appstate import AppState

log: Final = logging.getLogger("dialect_proxy")
access_log: Final = logging.getLogger("dialect_proxy.access")
_clock: Final = time.perf_counter
# uvicorn cancels the tasks still running when its graceful-shutdown timeout (our --shutdown-grace) is over, with
# this message; proxy.server.process.ProxyServer uses the same one.
SHUTDOWN_CANCEL_MSG: Final = "graceful shutdown exceeded"


class Inbound(Protocol):
    """A request as its transport brought it."""

    headers: Any  # its headers as ASGI lists them (the traceparent; the headers passthrough forwards)

    async def read(self) -> bytes | None:
        """The body's bytes (None: the transport has it parsed already)."""

    def parse(self, raw: bytes | None) -> dict[str, Any]:
        """The body as a JSON object (a ClientRequestError when it is not one)."""

    def watch(self) -> Disconnect:
        """The watch that cancels the request when the client goes away."""


class Endpoint(Protocol):
    """What an exchange serves: a client dialect's inference (proxy/endpoint/inference.py), or retrieval
    (proxy/endpoint/retrieval.py)."""

    state: AppState
    route: str  # its path, as the metrics, the trace and the access log name it

    async def answer(self, exchange: Exchange, inbound: Inbound, request: dict[str, Any], raw: bytes | None) -> int:
        """Decode the parsed request, route it (`Exchange.routed`) and serve it: the status the client got."""


class Exchange:
    """One request's way through an endpoint (made per request by `serve_http`, proxy/endpoint/inference.py, or
    `InferenceEndpoint.serve`)."""

    __slots__ = ("endpoint", "grant", "obs", "record", "relay", "sink", "size", "started", "state", "status", "trace",
                 "watch")

    def __init__(self, endpoint: Endpoint, sink: Sink, record: AccessRecord, started: float,
                 headers: Any) -> None:
        self.endpoint = endpoint
        self.state = state = endpoint.state
        self.sink = sink
        self.record = record
        self.started = started  # its time.perf_counter()
        self.obs: RequestObserver | None = None  # its metrics, once it is routed (or refused)
        self.watch: Disconnect | None = None
        self.relay: Relay | None = None  # the answer's stream, once the upstream answered
        self.status = 500
        self.size = 0  # the request body's bytes (the limiter counts its input tokens from them)
        self.grant: Grant | None = None  # its key's reservation (proxy/gateway/limits.py), settled at its end
        telemetry = state.telemetry  # OpenTelemetry (proxy/metrics/tracing.py): None unless configured
        self.trace: RequestTrace | None = None
        if telemetry is not None:
            self.trace = trace = telemetry.request(headers, record.route, started, record.request_id)
            record.trace_id = trace.trace_id
            record.span_id = trace.span_id

    async def run(self, inbound: Inbound) -> int:
        """Serve the request and answer it, whatever happens; the status the client got."""
        try:
            try:
                raw = await inbound.read()
                self.size = 0 if raw is None else len(raw)
                if self.state.shutting_down:
                    raise ProxyError("The proxy is shutting down.", 503, code="shutting_down")
                self.status = await self.endpoint.answer(self, inbound, inbound.parse(raw), raw)
            except ProxyError as err:
                # Its traceback holds the frames that raised it, and they hold it (`raise err` after an `except`):
                # dropped here, so that a refused request leaves no reference cycle (tests/test_gc.py).
                err.__traceback__ = None
                self.status = await self._refused(err)
            except ClientGone:
                self.record.client_disconnected = True
                self.status = 499
            except Exception:  # a bug of ours: the client still gets an error in its dialect, never a stack trace
                self.status = await self._bug()
        except asyncio.CancelledError as cancelled:
            if not await self._cancelled(cancelled):
                raise
        finally:
            self._end()
        return self.status

    # -- serving ----------------------------------------------------------------------------------------------
    async def routed(self, request: dict[str, Any], ctx: RequestContext, inbound: Inbound) -> RequestContext:
        """The request (its body, decoded) goes where `ctx` says: its metrics, the trace and the access record say
        so, the client's leaving is watched from now on, and its key's limits admit it. Its context again."""
        record = self.record
        record.upstream = ctx.upstream.name
        record.model = ctx.client_model
        record.stream = ctx.stream
        self.obs = obs = self.state.metrics.request(record.route, ctx.upstream.name, ctx.client_model, ctx.stream,
                                                    started_at=self.started, key=record.key)
        if self.trace is not None:
            self.trace.routed(request, ctx, self.state.dialects[ctx.upstream.name].name, obs.model)
        self.watch = inbound.watch()
        if record.key is not None:
            await self._limits(record.key, request, ctx)
        return ctx

    async def _limits(self, key: str, request: dict[str, Any], ctx: RequestContext) -> None:
        """The key's policy (proxy/gateway/keys.py): its share in the replicas' queues, and its limits admit the
        request (proxy/gateway/limits.py) or refuse it; the rate-limit headers go on the answer either way."""
        policy = self.state.keys.policy(key)
        if policy is None:
            return
        queue_as(policy.name, policy.weight)
        size = self.size or len(orjson.dumps(request))
        try:
            self.grant, view = await self.state.limiter.admit(policy, ctx.client_model, request, size,
                                                              ctx.kind in (CHAT, COMPLETIONS))
        except LimitRefused as refused:
            if refused.view is not None:
                self.sink.limits(refused.view)
            raise
        if view is not None:
            self.sink.limits(view)

    def upstream_started(self) -> float:
        """The upstream part begins (for the metrics): its deadline, the whole request's limit from now."""
        assert self.watch is not None and self.obs is not None  # routed
        self.obs.upstream_started()
        return self.watch.loop.time() + self.state.settings.server.total_timeout

    async def upstream_body(self, resp: Any, deadline: float) -> bytes:
        """An upstream answer's whole body, read within `deadline` and the idle timeout; the wait counted."""
        assert self.watch is not None and self.obs is not None  # routed
        loop = self.watch.loop
        started = loop.time()
        raw = await read_body(resp, max(deadline - started, 0.001), idle=self.state.settings.server.idle_timeout,
                              loop=loop)
        self.obs.add_upstream_wait(loop.time() - started)
        return raw

    def complete(self) -> None:
        """The answer is complete (set just before its last bytes): a disconnect now no longer cancels it."""
        if self.watch is not None:
            self.watch.complete = True

    def truncated(self, reason: str, code: str) -> None:
        """A stream under way was cut (`reason`) by the error `code`: counted and logged."""
        if self.obs is not None:
            self.obs.truncated(reason)
        self.record.error = code
        self.record.truncated = reason

    # -- the ways a request ends without its answer -----------------------------------------------------------
    async def _refused(self, err: ProxyError) -> int:
        """A ProxyError before the answer (or after it began, outside the relay): the client dialect's error."""
        self.state.redactor.sanitize(err)
        record = self.record
        record.error = err.code
        obs = self.obs
        if obs is None:  # refused before routing (bad JSON, 413, unknown model): still counted
            obs = self.obs = self.state.metrics.request(record.route, record.upstream or "", record.model or "",
                                                        bool(record.stream), started_at=self.started, key=record.key)
        if isinstance(err, UpstreamError | UpstreamUnreachable | UpstreamTimeout):
            obs.upstream_error(record.dialect or "any", err.upstream_code or err.code)
        self.complete()
        return await self._fail(err)

    async def _bug(self) -> int:
        log.exception("unexpected error in %s (request %s)", self.record.route, self.record.request_id)
        self.record.error = "internal_error"
        bug = ProxyError("Internal error in the proxy.", 500, type="server_error", code="internal_error")
        if self.watch is None or not self.watch.complete:
            await self._fail(bug)
        return 500

    async def _fail(self, err: ProxyError) -> int:
        """Tell the client about `err` in its dialect: the error event that ends a stream already under way, else an
        error response. The status the client got (a stream under way keeps its 200)."""
        err.request_id = self.record.request_id  # for the envelopes that carry it (Anthropic's)
        relay = self.relay
        if relay is not None and relay.committed:
            await relay.flush(relay.error_event(err), more=False)
            return 200
        return await self.sink.refuse(err, [])

    async def _cancelled(self, cancelled: asyncio.CancelledError) -> bool:
        """The request's task was cancelled: by the client leaving, or at the end of the shutdown grace period (the
        client gets an error it can see). False: another cancellation, which goes on."""
        watch = self.watch
        if watch is None:
            return False
        if watch.disconnected:
            _uncancel()
            self.record.client_disconnected = True
            self.status = 499
            return True
        if not _is_shutdown_cancel(cancelled):
            return False
        _uncancel()
        err = ProxyError("The proxy is shutting down; the request was cut at the end of the grace period.", 503,
                         code="shutting_down")
        self.record.error = err.code
        self.status = 503
        if self.obs is not None and self.relay is not None and self.relay.committed:
            self.obs.truncated("shutdown")
        watch.complete = True
        with contextlib.suppress(Exception):
            await self._fail(err)
        return True

    def _end(self) -> None:
        """The request is over: its metrics, its trace, its access log line."""
        if self.watch is not None:
            self.watch.stop()
        if self.grant is not None:
            self.state.limiter.settle(self.grant, self._tokens_used())
            self.grant = None
        self.relay = None  # (it refers back to the exchange: no reference cycle outlives the request)
        duration = _clock() - self.started
        record = self.record
        status = self.status
        obs = self.obs
        if obs is not None:
            obs.finish(status, record.client_disconnected, record.finish_reason, record.error)
        if self.trace is not None:
            self.trace.finish(status, obs, record.error, record.client_disconnected)
        if access_log.isEnabledFor(logging.INFO):
            ttft = obs.ttft if obs is not None and record.stream else None
            access_log.info(record.line(status, duration, ttft))

    def _tokens_used(self) -> int | None:
        """The tokens the request used, for its key's limits: the upstream's usage; 0 for an error answer that
        generated nothing; None (the reservation stays) when unknown — a stream cut short, a client gone."""
        record = self.record
        prompt, completion = record.prompt_tokens, record.completion_tokens
        if isinstance(prompt, int) or isinstance(completion, int):
            return (prompt if isinstance(prompt, int) else 0) + (completion if isinstance(completion, int) else 0)
        if self.status >= 400 and not record.client_disconnected and record.truncated is None:
            return 0
        return None


def _uncancel() -> None:
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


def _is_shutdown_cancel(exc: asyncio.CancelledError) -> bool:
    return any(isinstance(a, str) and SHUTDOWN_CANCEL_MSG in a for a in exc.args)
