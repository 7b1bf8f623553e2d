"""Emulated structured output over upstream attempts (the hub's part, without I/O: proxy/hub/structured.py).

Each attempt asks the upstream for a whole answer (never a stream: the JSON is checked whole before any of it goes
out), reads it through the same pipeline as any answer, and checks it against the client's schema. A failing answer
is asked again with the validation error, up to the upstream's `structured_attempts`; the first passing one goes to
the client through the ordinary encoder and relay (proxy/endpoint/translate.py `_Answering.deliver`) — streamed, as
content deltas after the reasoning, when the client asked for a stream. None passing: the client gets
`structured_output_failed` (502) in its dialect's envelope, never the invalid JSON. Every attempt's usage adds up in
the answer's, each attempt is a span of the trace, and the metrics count emulated, re-asked and failed requests.

A streaming client is kept alive while the attempts run, as the ordinary stream is (proxy/endpoint/relay.py): a
silence of `keepalive_interval` sends the client dialect's keep-alive, committing the head; a failure after that is the
client dialect's in-stream error (counted as a truncation), before it the HTTP error.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from proxy.clients.base import ClientCall
from proxy.errors import ProxyError
from proxy.gateway.upstream import release
from proxy.hub import structured
from proxy.hub.canonical import RequestContext
from proxy.hub.events import Answer, Delta
from proxy.hub.pipeline import Pipeline

if TYPE_CHECKING:
    from proxy.endpoint.exchange import Exchange
    from proxy.endpoint.translate import Translation, Upstream, _Answering

# The passing attempt: its upstream request, its events for the client, its Answer.
Passed = tuple["Upstream", list[Delta], Answer]


def emulation(translation: Translation, call: ClientCall, ctx: RequestContext) -> structured.Plan | None:
    """The plan when this upstream emulates what the request asks (None: the request goes the ordinary way)."""
    request = call.request
    if ctx.kind != "chat" or ("response_format" not in request and "tools" not in request):
        return None
    dialect = translation.state.dialects[ctx.upstream.name]
    caps = dialect.structured_caps(request, ctx)
    if "response_format" not in request:  # a forced tool of the client's own, on a model that calls no tools
        return structured.call_plan(request, caps, ctx.upstream.structured_attempts)
    if dialect.response_format_mode(ctx) != "emulate":
        return None
    return structured.plan(request, caps, ctx.upstream.structured_attempts)


class Emulation:
    """One emulated structured-output request: its attempts, then the answer or the error."""

    def __init__(self, translation: Translation, call: ClientCall, ctx: RequestContext, exchange: Exchange,
                 plan: structured.Plan) -> None:
        self.translation = translation
        self.call = call
        self.ctx = ctx
        self.exchange = exchange
        self.plan = plan
        self.usage: dict[str, Any] | None = None  # every attempt's, added up
        self.up: Upstream | None = None  # the latest attempt's upstream request, once prepared
        self.answering: _Answering | None = None  # the client's answer, made at the first keep-alive or the end

    async def serve(self) -> int:
        """The attempts, then the passing answer to the client (a stream kept alive while they run)."""
        if not self.ctx.stream:
            return await self._deliver(*await self._attempts())
        interval = self.exchange.state.settings.server.keepalive_interval
        task = asyncio.ensure_future(self._attempts())
        try:
            while not (await asyncio.wait((task,), timeout=interval))[0]:
                await self._keepalive()
            passed = task.result()
        except ProxyError as err:
            if self.answering is None or not self.answering.relay.committed:
                raise  # nothing reached the client yet: the HTTP error in its dialect's envelope
            return await self.answering.cut(err)  # after a keep-alive: the in-stream error
        finally:
            if not task.done():  # the client left: the attempts stop
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return await self._deliver(*passed)

    async def _keepalive(self) -> None:
        """A silence while the attempts run: the client dialect's keep-alive (the head goes first)."""
        if self.answering is None:
            if self.up is None:  # the first attempt is not even prepared: wait for the next interval
                return
            self.answering = self.translation.answering(self.call, self.ctx, self.exchange, self.up)
        await self.answering.relay.keepalive(self.answering.encoder.keepalive)

    async def _attempts(self) -> Passed:
        """Up to `attempts` upstream answers, until one passes the check (None passing: the 502)."""
        plan = self.plan
        metrics = self.translation.state.metrics
        upstream = self.ctx.upstream.name
        metrics.structured_output(upstream, "emulated")
        history: list[dict[str, Any]] = []
        deadline = self.exchange.upstream_started()
        error = ""
        for attempt in range(1, plan.attempts + 1):
            if attempt > 1:
                metrics.structured_output(upstream, "reasked")
            up, events, answer = await self._attempt(structured.rewrite(self.call.request, plan, history), deadline)
            reading = structured.read(events, plan)
            problem = None if reading.passthrough is not None else structured.check(reading, plan.ask)
            if self.exchange.trace is not None:
                self.exchange.trace.structured_attempt(attempt, plan.way, problem)
            if problem is None:
                return up, structured.answer_events(reading, plan), answer
            error = problem
            history += structured.reask(plan, reading, problem)
        metrics.structured_output(upstream, "failed")
        if self.usage is not None:  # the tokens were paid for even though nothing was sent
            if self.exchange.obs is not None:
                self.exchange.obs.usage(self.usage)
            self.exchange.record.usage(self.usage)
        raise structured.StructuredOutputFailed(
            f"The upstream gave no answer valid against the requested {plan.ask.kind} in {plan.attempts} attempts "
            f"(structured output is emulated for it: docs/structured-output.md); the last one failed {error}. "
            "No invalid JSON was sent.")

    async def _attempt(self, body: dict[str, Any], deadline: float) -> tuple[Upstream, list[Delta], Answer]:
        """One whole upstream answer to `body`: its events and its Answer (the usage is added to the total)."""
        # The attempt's own call and context, whole and not streamed (made anew: the classes are compiled in the
        # mypyc build, where copying an instance is not supported).
        call = ClientCall(body, self.call.kind, self.call.model, False, self.call.headers)
        call.log_note = self.call.log_note
        c = self.ctx
        ctx = RequestContext(c.kind, c.request_id, c.client_model, c.upstream_model, c.upstream, False, c.response_id,
                             c.created, c.attempt)
        exchange = self.exchange
        state = self.translation.state
        up = self.up = await self.translation.prepare(call, ctx, exchange)
        assert exchange.watch is not None
        attempts = exchange.record.attempts = state.replicas[ctx.upstream.name].attempts(body)
        ticket, resp = await attempts.open(ctx, up.path, up.payload, up.dialect.request_headers, deadline,
                                           exchange.watch.loop, exchange.trace)
        if exchange.trace is not None:
            exchange.trace.answering(resp.status, Answer())
        if exchange.obs is not None:
            exchange.obs.upstream_headers()
        ok = False
        try:
            raw = await exchange.upstream_body(resp, deadline)
            if resp.status >= 300:
                raise up.dialect.errors.answer(resp.status, raw, {k.lower(): v for k, v in resp.headers.items()},
                                               up.path, ctx.upstream.name, ctx.upstream.dialect)
            answer = Answer()
            events: list[Delta] = []
            pipeline = Pipeline(up.session, answer)
            pipeline.feed_body(raw, events)
            pipeline.finish(events)
            ok = True
        finally:
            ticket.release()
            if ok:
                await release(resp)
            else:
                resp.close()
        self.usage = structured.add_usage(self.usage, answer.usage)
        return up, events, answer

    async def _deliver(self, up: Upstream, events: list[Delta], last: Answer) -> int:
        """The passing answer to the client, with the usage of every attempt."""
        answering = self.answering
        if answering is None:
            answering = self.translation.answering(self.call, self.ctx, self.exchange, up)
        else:  # made at a keep-alive with an earlier attempt's request: the passing one's continuity and timings
            answering.up = up
        final = answering.answer
        final.usage = self.usage
        final.usage_extras = last.usage_extras
        final.envelope_extra = last.envelope_extra
        final.upstream_id = last.upstream_id
        final.upstream_model = last.upstream_model
        final.finish_reason = events[-1].finish_reason if events else last.finish_reason
        if self.exchange.trace is not None:
            self.exchange.trace.answering(200, final)
        return await answering.deliver(events)
