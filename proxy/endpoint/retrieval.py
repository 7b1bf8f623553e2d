"""The retrieval endpoints: `POST /v1/embeddings` and `POST /rerank`, `/v1/rerank`, `/v2/rerank` — JSON in, JSON out,
no stream.

Glue only, as the inference endpoint (proxy/endpoint/inference.py) is for chat: the client side decodes and
validates (proxy/clients/embeddings.py, proxy/clients/rerank.py), the router picks the upstream by model and kind
(proxy/gateway/routing.py `resolve_kind`), the upstream's wire (proxy/hub/retrieval.py, `Dialect.retrieval_wire`)
builds one body per batch, each goes through the upstream's replicas (admission, failover) and is read back, and the
client side encodes the joined answer. Inputs beyond the wire's batch limit go in batches, one after another, and
are joined in order. Metrics (route, upstream, model; prompt tokens), the OpenTelemetry span
(`gen_ai.operation.name` embeddings / rerank) and the access log line are the chat endpoint's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import orjson

from proxy.clients import embeddings, rerank
from proxy.clients.base import ClientCall
from proxy.endpoint.request import (
    ClientGone,
    Disconnect,
    Scope,
    parse_body,
    read_request_body,
    scan_headers,
    send_json,
    take_request_id,
)
from proxy.errors import ProxyError, UpstreamError, UpstreamTimeout, UpstreamUnreachable
from proxy.gateway.upstream import read_body, release
from proxy.hub.canonical import RequestContext
from proxy.hub.events import Answer
from proxy.hub.retrieval import EMBEDDINGS, RERANK, EmbedCall, Ranked, RerankCall, UpstreamAnswer, Usage

if TYPE_CHECKING:
    from proxy.hub.retrieval import RetrievalWire
    from proxy.metrics.observer import RequestObserver
    from proxy.metrics.tracing import RequestTrace
    from proxy.server.appstate import AppState

log: Final = logging.getLogger("dialect_proxy")
access_log: Final = logging.getLogger("dialect_proxy.access")
KEY_NAME_SCOPE: Final = "dialect_proxy.key_name"  # as proxy/endpoint/inference.py: the inbound key's name


@dataclass(slots=True)
class Exchange:
    """One retrieval request's upstream side: where it goes and what it has cost so far."""

    state: AppState
    ctx: RequestContext
    wire: RetrievalWire
    request: dict[str, Any]
    info: dict[str, Any]
    trace: RequestTrace | None
    deadline: float
    batches: int = 0

    async def post(self, path: str, body: dict[str, Any]) -> UpstreamAnswer | None:
        """One upstream request through the replicas: its 2xx answer, None when the server refused the batch as
        too large and the wire learnt its limit (send again), else the upstream's error."""
        state, ctx = self.state, self.ctx
        dialect = state.dialects[ctx.upstream.name]
        loop = asyncio.get_running_loop()
        attempts = state.replicas[ctx.upstream.name].attempts(self.request, self.info)
        # The trace's upstream (CLIENT) span is the first batch's: a request traces one upstream exchange, and the
        # span's end (proxy/metrics/tracing.py) carries the whole call's usage.
        trace = self.trace if self.batches == 0 else None
        ticket, resp = await attempts.open(ctx, path, orjson.dumps(body), dialect.request_headers, self.deadline,
                                           loop, trace)
        done = False
        try:
            raw = await read_body(resp, max(self.deadline - loop.time(), 0.001),
                                  idle=state.settings.server.idle_timeout, loop=loop)
            done = True
        finally:
            ticket.release()
            if done:
                await release(resp)
            else:
                resp.close()
        self.batches += 1
        answer = UpstreamAnswer(resp.status, raw, {k.lower(): v for k, v in resp.headers.items()})
        if resp.status < 300:
            return answer
        if self.wire.learn(answer):
            return None
        raise dialect.errors.answer(resp.status, raw, answer.headers, path, ctx.upstream.name, ctx.upstream.dialect)


async def embed(ex: Exchange, call: EmbedCall) -> tuple[bytes, Usage]:
    """The call's vectors, batch by batch in order, encoded for the client."""
    vectors: list[list[float]] = []
    usage = Usage()
    start = 0
    while start < len(call.inputs):
        limit = ex.wire.batch_limit() or len(call.inputs)
        batch = call.inputs[start:start + limit]
        path, body = ex.wire.embed_request(call, batch, ex.ctx.upstream_model)
        answer = await ex.post(path, body)
        if answer is None:  # the server's limit is lower than the wire thought: the same inputs, split
            continue
        got = ex.wire.embed_answer(answer, len(batch))
        vectors.extend(got.vectors)
        usage.add(got.tokens, batch)
        start += len(batch)
    return embeddings.encode(call, vectors, usage), usage


async def rank(ex: Exchange, call: RerankCall) -> tuple[bytes, Usage]:
    """The documents' scores, batch by batch (a cross-encoder scores each document against the query alone, so
    batches join), encoded for the client: sorted, cut to top_n."""
    ranked: list[Ranked] = []
    usage = Usage()
    start = 0
    docs = call.documents
    while start < len(docs):
        limit = ex.wire.batch_limit() or len(docs)
        batch = docs[start:start + limit]
        path, body = ex.wire.rerank_request(call, batch, ex.ctx.upstream_model)
        answer = await ex.post(path, body)
        if answer is None:
            continue
        got = ex.wire.rerank_answer(answer, len(batch))
        ranked.extend(Ranked(r.index + start, r.score) for r in got.ranked)
        usage.add(got.tokens, [call.query, *batch])
        start += len(batch)
    return rerank.encode(call, ranked, usage), usage


class RetrievalEndpoint:
    """POST on one retrieval path: `kind` is EMBEDDINGS or RERANK."""

    def __init__(self, state: AppState, path: str, kind: str) -> None:
        self.state = state
        self.route = path
        self.kind = kind

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        state = self.state
        started = time.perf_counter()
        rid_raw, length = scan_headers(scope["headers"])
        request_id, rid_bytes = take_request_id(rid_raw)
        info: dict[str, Any] = {"request_id": request_id, "route": self.route}
        if scope.get(KEY_NAME_SCOPE):
            info["key"] = scope[KEY_NAME_SCOPE]
        trace = None if state.telemetry is None else state.telemetry.request(scope, self.route, started, info)
        run = _Run(self, info, trace, started)
        rid = [(b"x-request-id", rid_bytes)]
        status = 500
        watch: Disconnect | None = None
        try:
            try:
                body = await read_request_body(length, receive, state.settings.server.max_body_bytes)
                watch = Disconnect(receive, scope)  # the client leaves: the upstream request is closed at once
                payload = await run.answer(body)
                watch.complete = True
                status = 200
                await send_json(send, 200, payload, rid)
            except ProxyError as err:
                status = run.failed(err)
                if watch is not None:
                    watch.complete = True
                await send_json(send, err.status, err.body(), _headers(err) + rid)
            except ClientGone:
                info["client_disconnected"] = True
                status = 499
            except Exception:  # a bug of ours: an error in the client's envelope, never a stack trace
                log.exception("unexpected error in %s (request %s)", self.route, request_id)
                bug = ProxyError("Internal error in the proxy.", 500, type="server_error", code="internal_error")
                info["error"] = bug.code
                await send_json(send, 500, bug.body(), rid)
        except asyncio.CancelledError:
            if watch is None or not watch.disconnected:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            info["client_disconnected"] = True
            status = 499
        finally:
            if watch is not None:
                watch.stop()
            run.finish(status)


class _Run:
    """One request's bookkeeping: its observer, trace and access-log line."""

    def __init__(self, endpoint: RetrievalEndpoint, info: dict[str, Any], trace: RequestTrace | None,
                 started: float) -> None:
        self.endpoint = endpoint
        self.state = endpoint.state
        self.info = info
        self.trace = trace
        self.started = started
        self.obs: RequestObserver | None = None

    def observe(self, upstream: str, model: str) -> RequestObserver:
        self.obs = self.state.metrics.request(self.endpoint.route, upstream, model, False, started_at=self.started,
                                              key=self.info.get("key"))
        return self.obs

    async def answer(self, body: bytes) -> bytes:
        state, endpoint, info = self.state, self.endpoint, self.info
        if state.shutting_down:
            raise ProxyError("The proxy is shutting down.", 503, code="shutting_down")
        request = parse_body(body)
        call: EmbedCall | RerankCall
        call = embeddings.decode(request) if endpoint.kind == EMBEDDINGS else rerank.decode(request, endpoint.route)
        route = state.router.resolve_kind(call.model, endpoint.kind)
        ctx = RequestContext(endpoint.kind, info["request_id"], call.model, route.upstream_model, route.upstream,
                             False, "", int(time.time()))
        dialect = state.dialects[route.upstream.name]
        info.update(upstream=route.upstream.name, model=call.model, dialect=dialect.name)
        obs = self.observe(route.upstream.name, call.model)
        if self.trace is not None:
            self.trace.routed(ClientCall(request, endpoint.kind, call.model, False), ctx, dialect.name, obs.model)
        ex = Exchange(state, ctx, dialect.retrieval_wire(), request, info, self.trace,
                      asyncio.get_running_loop().time() + state.settings.server.total_timeout)
        obs.upstream_started()
        try:
            payload, usage = await (embed(ex, call) if isinstance(call, EmbedCall) else rank(ex, call))
        finally:
            info["batches"] = ex.batches
            m = state.metrics
            if ex.batches:
                m.child(m.retrieval_batches, endpoint.route, m.upstream_label(route.upstream.name)).inc(ex.batches)
        obs.usage({"prompt_tokens": usage.prompt_tokens})
        info.update(prompt_tokens=usage.prompt_tokens, tokens_estimated=usage.estimated)
        if self.trace is not None:
            answer = Answer()
            answer.usage = {"prompt_tokens": usage.prompt_tokens}
            self.trace.answering(200, answer)
        return payload

    def failed(self, err: ProxyError) -> int:
        self.state.redactor.sanitize(err)
        self.info["error"] = err.code
        obs = self.obs or self.observe(self.info.get("upstream", ""), self.info.get("model", ""))
        if isinstance(err, UpstreamError | UpstreamUnreachable | UpstreamTimeout):
            obs.upstream_error(self.info.get("dialect", "any"), err.upstream_code or err.code)
        return err.status

    def finish(self, status: int) -> None:
        info = self.info
        if self.obs is not None:
            self.obs.finish(status, bool(info.get("client_disconnected")), None, info.get("error"))
        if self.trace is not None:
            self.trace.finish(status, self.obs)
        if access_log.isEnabledFor(logging.INFO):
            info["status"] = status
            info["duration_ms"] = round((time.perf_counter() - self.started) * 1000, 2)
            access_log.info(orjson.dumps(info).decode())


def _headers(err: ProxyError) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in err.response_headers().items()]


def routes(state: AppState) -> list[tuple[str, RetrievalEndpoint]]:
    """(path, endpoint) of every retrieval route."""
    return [("/v1/embeddings", RetrievalEndpoint(state, "/v1/embeddings", EMBEDDINGS)),
            *((path, RetrievalEndpoint(state, path, RERANK)) for path in rerank.PATHS)]
