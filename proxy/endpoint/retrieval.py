"""The retrieval endpoints: `POST /v1/embeddings` and `POST /rerank`, `/v1/rerank`, `/v2/rerank` — JSON in, JSON out,
no stream.

A third path of the exchange (proxy/endpoint/exchange.py) beside translation and passthrough: the exchange reads the
body, routes, watches the client and the shutdown, answers errors and writes the metrics, the trace and the access
line, as for chat. What is retrieval's own is here: the client side decodes and validates (proxy/clients/embeddings.py,
proxy/clients/rerank.py), the router picks the upstream by model and kind (proxy/gateway/routing.py `resolve_kind`),
the upstream's wire (proxy/hub/retrieval.py, `Dialect.retrieval_wire`) builds one body per batch, each goes through
the upstream's replicas (admission, failover) and is read back, and the client side encodes the joined answer, which
goes whole (`Sink.whole`). Inputs beyond the wire's batch limit go in batches, one after another, and are joined in
order. The access line adds `batches` and, when the proxy counted the tokens itself, `tokens_estimated`; the
OpenTelemetry span's `gen_ai.operation.name` is embeddings / rerank.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import orjson

from proxy.clients import embeddings, rerank
from proxy.clients.base import openai_error_response
from proxy.clients.ratelimit import openai_headers
from proxy.endpoint.inference import serve_http
from proxy.gateway.upstream import release
from proxy.hub.canonical import RequestContext
from proxy.hub.events import Answer
from proxy.hub.retrieval import EMBEDDINGS, RERANK, EmbedCall, Ranked, RerankCall, UpstreamAnswer, Usage

if TYPE_CHECKING:
    from proxy.clients.base import Headers
    from proxy.dialects.base import Dialect
    from proxy.endpoint.exchange import Exchange, Inbound
    from proxy.endpoint.request import Scope
    from proxy.errors import ProxyError
    from proxy.gateway.limits import LimitView
    from proxy.hub.retrieval import RetrievalWire
    from proxy.server.appstate import AppState

_wall_clock: Final = time.time


@dataclass(slots=True)
class Batches:
    """One retrieval call's upstream side: where its batches go, and how many went so far."""

    exchange: Exchange
    ctx: RequestContext
    dialect: Dialect
    wire: RetrievalWire
    request: dict[str, Any]  # the client's body (the replicas' affinity reads it)
    deadline: float  # the whole call's, on the request's loop clock
    count: int = 0

    async def post(self, path: str, body: dict[str, Any]) -> UpstreamAnswer | None:
        """One upstream request through the replicas: its 2xx answer, None when the server refused the batch as
        too large and the wire learnt its limit (send again), else the upstream's error."""
        exchange, ctx = self.exchange, self.ctx
        assert exchange.watch is not None  # routed
        loop = exchange.watch.loop
        attempts = exchange.record.attempts = exchange.state.replicas[ctx.upstream.name].attempts(self.request)
        # The trace's upstream (CLIENT) span is the first batch's: a request traces one upstream exchange, and the
        # span's end (proxy/metrics/tracing.py) carries the whole call's usage.
        trace = exchange.trace if self.count == 0 else None
        ticket, resp = await attempts.open(ctx, path, orjson.dumps(body), self.dialect.request_headers,
                                           self.deadline, loop, trace)
        done = False
        try:
            raw = await exchange.upstream_body(resp, self.deadline)
            done = True
        finally:
            ticket.release()
            if done:
                await release(resp)
            else:  # a client that left, or a timeout: close, so the upstream stops
                resp.close()
        self.count += 1
        answer = UpstreamAnswer(resp.status, raw, {k.lower(): v for k, v in resp.headers.items()})
        if resp.status < 300:
            return answer
        if self.wire.learn(answer):
            return None
        raise self.dialect.errors.answer(resp.status, raw, answer.headers, path, ctx.upstream.name,
                                         ctx.upstream.dialect)


async def embed(ex: Batches, call: EmbedCall) -> tuple[bytes, Usage]:
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


async def rank(ex: Batches, call: RerankCall) -> tuple[bytes, Usage]:
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


class OpenAIErrors:
    """The error envelope of every retrieval route: OpenAI's (its SDK's embeddings, and Cohere's and Jina's clients
    read its `message`)."""

    def error_response(self, err: ProxyError) -> tuple[int, Headers, bytes]:
        return openai_error_response(err)

    def rate_limit_headers(self, view: LimitView) -> Headers:
        return openai_headers(view)


_ERRORS: Final = OpenAIErrors()


class RetrievalEndpoint:
    """POST on one retrieval path: `kind` is EMBEDDINGS or RERANK."""

    def __init__(self, state: AppState, path: str, kind: str) -> None:
        self.state = state
        self.route = path
        self.kind = kind

    def __call__(self, scope: Scope, receive: Any, send: Any) -> Coroutine[Any, Any, int]:
        return serve_http(self, _ERRORS, scope, receive, send)

    async def answer(self, exchange: Exchange, inbound: Inbound, request: dict[str, Any], raw: bytes | None) -> int:
        """Decode, route by kind, send the batches and answer the joined result whole."""
        call: EmbedCall | RerankCall
        call = embeddings.decode(request) if self.kind == EMBEDDINGS else rerank.decode(request, self.route)
        route = self.state.router.resolve_kind(call.model, self.kind)
        ctx = RequestContext(self.kind, exchange.record.request_id, call.model, route.upstream_model, route.upstream,
                             False, "", int(_wall_clock()))
        await exchange.routed(request, ctx, inbound)
        payload, usage = await self._batches(exchange, ctx, call)
        self._usage(exchange, usage)
        exchange.complete()
        await exchange.sink.whole(payload, [])
        return 200

    async def _batches(self, exchange: Exchange, ctx: RequestContext, call: EmbedCall | RerankCall,
                       ) -> tuple[bytes, Usage]:
        """The call's answer for the client, from as many upstream requests as its batches take (counted)."""
        state = self.state
        dialect = state.dialects[ctx.upstream.name]
        exchange.record.dialect = dialect.name
        deadline = exchange.upstream_started()
        batches = Batches(exchange, ctx, dialect, dialect.retrieval_wire(), call.request, deadline)
        try:
            return await (embed(batches, call) if isinstance(call, EmbedCall) else rank(batches, call))
        finally:
            exchange.record.batches = batches.count
            if batches.count:
                m = state.metrics
                m.child(m.retrieval_batches, self.route, m.upstream_label(ctx.upstream.name)).inc(batches.count)

    @staticmethod
    def _usage(exchange: Exchange, usage: Usage) -> None:
        """The tokens the upstream read, for the metrics, the access line and the trace."""
        tokens = {"prompt_tokens": usage.prompt_tokens}
        assert exchange.obs is not None
        exchange.obs.usage(tokens)
        exchange.record.prompt_tokens = usage.prompt_tokens
        exchange.record.tokens_estimated = usage.estimated
        if exchange.trace is not None:
            answer = Answer()
            answer.usage = tokens
            exchange.trace.answering(200, answer)


def routes(state: AppState) -> list[tuple[str, RetrievalEndpoint]]:
    """(path, endpoint) of every retrieval route."""
    return [("/v1/embeddings", RetrievalEndpoint(state, "/v1/embeddings", EMBEDDINGS)),
            *((path, RetrievalEndpoint(state, path, RERANK)) for path in rerank.PATHS)]
