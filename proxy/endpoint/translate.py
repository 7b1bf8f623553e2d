"""A decoded call served by translation: the upstream spoke builds the request, the gateway sends it (replicas,
retries, deadlines), the pipeline turns the answer into hub events (proxy/hub/pipeline.py), the client spoke encodes
them, and the relay (proxy/endpoint/relay.py) takes them to the exchange's sink. A stream and a whole body go the
same way: the whole body is one feed of the pipeline (docs/hub.md).

The upstream is read only as fast as the client takes the answer (the sink's send waits while the socket's write
buffer is full).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

import orjson

from proxy.endpoint.relay import Relay
from proxy.endpoint.request import SSE_HEADERS
from proxy.endpoint.structured import Emulation, emulation
from proxy.errors import ClientRequestError, ProxyError, UpstreamError
from proxy.gateway.upstream import StreamReads, release
from proxy.hub import continuity
from proxy.hub.events import Answer
from proxy.hub.pipeline import Pipeline

if TYPE_CHECKING:
    from proxy.clients.base import ClientCall, ClientDialect, Encoder
    from proxy.dialects.base import Dialect, UpstreamSession
    from proxy.endpoint.exchange import Exchange
    from proxy.hub.canonical import RequestContext
    from proxy.hub.events import Delta
    from proxy.server.appstate import AppState

log: Final = logging.getLogger("dialect_proxy")
_dumps: Final = orjson.dumps
_SECRET_KEYS: Final = ("authorization", "api_key", "apikey", "api-key", "password", "secret", "token")


class Upstream:
    """What the upstream is sent for one call: its spoke, its session, the path and the body."""

    __slots__ = ("dialect", "path", "payload", "recorder", "session")

    def __init__(self, dialect: Dialect, session: UpstreamSession, path: str, payload: bytes,
                 recorder: continuity.Recorder | None) -> None:
        self.dialect = dialect
        self.session = session
        self.path = path
        self.payload = payload
        self.recorder = recorder  # reasoning continuity's recorder, when the mode needs one


class Translation:
    """One client dialect's translated path."""

    def __init__(self, state: AppState, client: ClientDialect[Any]) -> None:
        self.state = state
        self.client = client

    async def serve(self, call: ClientCall, ctx: RequestContext, exchange: Exchange) -> int:
        """Send the translated request and answer it: the status the client got."""
        plan = emulation(self, call, ctx)
        if plan is not None:  # structured output the upstream cannot honour (docs/structured-output.md)
            return await Emulation(self, call, ctx, exchange, plan).serve()
        state = self.state
        up = await self.prepare(call, ctx, exchange)
        deadline = exchange.upstream_started()
        assert exchange.watch is not None
        loop = exchange.watch.loop
        # Replicas (proxy/gateway/replicas.py): a pre-header failure (refused, reset, timeout, HTTP 502/503) may go to
        # another replica. Nothing has been sent to the client yet; the 200 is committed only later, by the relay.
        attempts = exchange.record.attempts = state.replicas[ctx.upstream.name].attempts(call.request)
        ticket, resp = await attempts.open(ctx, up.path, up.payload, up.dialect.request_headers, deadline, loop,
                                           exchange.trace)
        reusable = False
        try:
            status = await self.answering(call, ctx, exchange, up).respond(resp, deadline)
            reusable = status == 200
            return status
        finally:
            ticket.release()
            if reusable:  # the answer is complete: keep the connection for the next request
                await release(resp)
            else:  # an error or a client that left: close, so the upstream stops generating
                resp.close()

    def answering(self, call: ClientCall, ctx: RequestContext, exchange: Exchange, up: Upstream) -> _Answering:
        """The way of one upstream answer to the client."""
        return _Answering(self, call, ctx, exchange, up)

    async def prepare(self, call: ClientCall, ctx: RequestContext, exchange: Exchange) -> Upstream:
        """The upstream request of `call`: its spoke's session, path and body."""
        state = self.state
        upstream = ctx.upstream
        dialect = state.dialects[upstream.name]
        exchange.record.dialect = dialect.name
        exchange.record.note = call.log_note
        path = dialect.path(ctx.kind)
        if path is None:
            raise ClientRequestError(
                f"The upstream `{upstream.name}` ({dialect.name}) has no {self.client.path} equivalent.",
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
        if state.settings.server.log_bodies and log.isEnabledFor(logging.DEBUG):
            log.debug(_dumps({"request_id": ctx.request_id, "client_body": redact(call.request),
                              "upstream_body": redact(upstream_body)}).decode())
        # Held for the whole answer (a retry sends it again): a compact copy, as orjson's own result keeps a 4 KiB
        # buffer however short the body (docs/speed.md), and the dict goes.
        payload = bytes(memoryview(_dumps(upstream_body)))
        return Upstream(dialect, session, path, payload, recorder)


class _Answering:
    """One upstream answer on its way through the pipeline and the client encoder to the relay."""

    __slots__ = ("answer", "call", "client", "ctx", "encoder", "events", "exchange", "pipeline", "relay",
                 "substantive", "tap", "up")

    def __init__(self, translation: Translation, call: ClientCall, ctx: RequestContext, exchange: Exchange,
                 up: Upstream) -> None:
        self.client = client = translation.client
        self.call = call
        self.ctx = ctx
        self.exchange = exchange
        self.up = up
        self.answer = answer = Answer()
        trace = exchange.trace
        self.tap = None if trace is None else trace.output  # the answer's text for the trace (opt-in)
        self.encoder: Encoder = client.encoder(call, ctx, answer)
        self.pipeline = Pipeline(up.session, answer)
        self.events: list[Delta] = []
        self.substantive = False  # a token or a finish is pending or sent: worth committing the 200 for
        if ctx.stream:
            head = [(b"content-type", client.content_type), *SSE_HEADERS, *call.headers]
            self.relay = Relay(exchange, head, self.encoder.error, self.encoder.head, client.stream_end)
        else:  # one JSON object, sent whole at the end
            self.relay = Relay(exchange, call.headers, self.encoder.error, stream=False)

    async def respond(self, resp: Any, deadline: float) -> int:
        """The upstream's answer (`resp`: its accepted response) to the client: the status the client got."""
        exchange = self.exchange
        if exchange.trace is not None:
            exchange.trace.answering(resp.status, self.answer)
        assert exchange.obs is not None
        exchange.obs.upstream_headers()
        content_type = resp.headers.get("Content-Type", "")
        if not self.ctx.stream or resp.status >= 300 or "text/event-stream" not in content_type:
            return await self._whole(await self._body(resp, deadline))
        return await self._stream(resp, deadline)

    def _account(self) -> None:
        """One batch of hub events: counted (chunks, tokens), recorded (continuity), traced (content capture) and
        encoded; the encoded bytes wait in the relay."""
        events = self.events
        tokens = 0
        count = len(events)
        for event in events:
            if event.content or event.reasoning or event.tool_calls:  # Delta.has_token, inlined (per event)
                tokens += 1
            elif event.finish_reason is not None:
                self.substantive = True
        if tokens:
            self.substantive = True
        obs = self.exchange.obs
        assert obs is not None
        obs.chunks(count, tokens)
        if self.up.recorder is not None:
            self.up.recorder.feed(events)
        if self.tap is not None:
            self.tap.feed(events)
        made = self.encoder.feed(events)
        events.clear()
        if made:
            self.relay.pending.extend(made)

    def _observe(self) -> None:
        """The answer's usage and the upstream's timings, for the metrics and the access record."""
        answer = self.answer
        self.relay.usage(answer)
        session = self.up.session
        extras = {**answer.usage_extras, **session.extras}
        timings = session.dialect.timings(extras) if extras else None
        if timings is not None and self.exchange.obs is not None:
            self.exchange.obs.upstream_timings(timings)

    async def _keep(self) -> None:
        """The answer is complete: what must outlive the request is kept before its last bytes go (a fast client's
        next turn must find it)."""
        if self.up.recorder is not None:
            await self.up.recorder.save()
        outcome = self.encoder.outcome()
        if outcome is not None:
            await self.client.completed(outcome)

    async def deliver(self, events: list[Delta]) -> int:
        """An answer already read and checked whole (emulated structured output, proxy/endpoint/structured.py):
        its events through the same encoder and relay, as a stream or as one object."""
        self.events.extend(events)
        self._account()
        self._observe()
        tail = self.encoder.finish()
        await self._keep()
        return await self.relay.end(tail)

    # -- a whole body ---------------------------------------------------------------------------------------------
    async def _body(self, resp: Any, deadline: float) -> bytes:
        """A non-stream answer's body (or an error's): an upstream error status or a stream request answered without
        an event stream is the upstream spoke's error."""
        raw = await self.exchange.upstream_body(resp, deadline)
        dialect = self.up.dialect
        if resp.status >= 300:
            raise dialect.errors.answer(resp.status, raw, {k.lower(): v for k, v in resp.headers.items()},
                                       self.up.path, self.ctx.upstream.name, self.ctx.upstream.dialect)
        if self.ctx.stream:
            try:
                data = orjson.loads(raw)
            except orjson.JSONDecodeError:
                data = None
            raise dialect.errors.in_json(data) or UpstreamError(
                "The upstream answered a stream request without an event stream.")
        return raw

    async def _whole(self, raw: bytes) -> int:
        """A whole body: the same pipeline, encoder and relay, fed once; the encoder's fold gives the JSON object."""
        try:
            self.pipeline.feed_body(raw, self.events)
            return await self._complete()
        except ProxyError as err:
            return await self._cut(err)

    # -- a stream -------------------------------------------------------------------------------------------------
    async def _stream(self, resp: Any, deadline: float) -> int:
        """Upstream event stream -> client event stream.

        The 200 head is sent lazily: with the first generated token (or finish), or when the first keep-alive is
        due. So an error that arrives as the stream's first event (a Siliconstorm `{"code": 701}` in an SSE line,
        MindIE's raw `Engine callback timeout` before any token) still reaches the client as an HTTP error status;
        only a failure after the head becomes the client dialect's in-stream error (never a clean end).
        """
        exchange = self.exchange
        assert exchange.watch is not None
        server = exchange.state.settings.server
        try:
            reads = StreamReads(resp, server.idle_timeout, server.keepalive_interval, deadline, exchange.watch.loop)
            try:
                await self._read(reads)
            finally:
                reads.close()  # the silence timer ends as soon as we stop reading (e.g. right after [DONE])
            return await self._complete()
        except ProxyError as err:
            return await self._cut(err)

    async def cut(self, err: ProxyError) -> int:
        """A failure before any upstream answer was relayed (emulated structured output, after a keep-alive): as
        `_cut`."""
        return await self._cut(err)

    async def _read(self, reads: StreamReads) -> None:
        relay = self.relay
        pipeline = self.pipeline
        while True:
            data = await reads.read()
            if data is None:
                await relay.keepalive(self.encoder.keepalive)
                continue
            if not data:
                return
            pipeline.feed(data, self.events)
            if self.events:
                self._account()
            # Until the head is sent, role-only chunks wait for the first token (or finish), so that a failure
            # before any generated text is still an HTTP error.
            if relay.pending and (relay.committed or pipeline.done or self.substantive):
                await relay.flush()
            if pipeline.done:
                return

    # -- the end ------------------------------------------------------------------------------------------------
    async def _complete(self) -> int:
        """The upstream's answer is all read: its last events, its usage, what must outlive the request, then the
        last events (a stream) or the one object (a whole answer)."""
        self.pipeline.finish(self.events)
        if self.events:
            self._account()
        self._observe()
        tail = self.encoder.finish()
        await self._keep()
        return await self.relay.end(tail)

    async def _cut(self, err: ProxyError) -> int:
        """A failure of the answer: before anything generated reached the client (always, for a whole answer), the
        HTTP error (raised); after, what arrived before it, then the in-stream error."""
        exchange = self.exchange
        exchange.state.redactor.sanitize(err)
        relay = self.relay
        if self.events and relay.stream:
            self._account()  # what arrived before the failure is still delivered, ahead of the error
        self._observe()
        if not relay.committed and not (relay.stream and self.substantive):
            raise err  # nothing generated reached the client yet: it gets the HTTP status and envelope
        if err.upstream_code and exchange.obs is not None:
            exchange.obs.upstream_error(self.up.dialect.name, err.upstream_code)
        return await self.relay.fail(err)


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
