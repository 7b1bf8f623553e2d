"""The proxy's own answer path, in-process, for dialect tests: upstream bytes (or a JSON body) -> upstream session ->
pipeline -> normaliser -> the Chat Completions client encoder -> what a chat client receives."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.clients.base import Encoder
from proxy.clients.chat import ChatClient, ChatEncoder, chat_encoder
from proxy.dialects import dialect_usage_fields
from proxy.dialects.base import Dialect, UpstreamSession
from proxy.hub.canonical import RequestContext
from proxy.hub.events import Answer, Delta
from proxy.hub.pipeline import Pipeline
from proxy.hub.sse import Event, SSEDecoder, encode_events
from proxy.settings import ClientSettings, UpstreamSettings

# The client's stream_options.include_usage per context, for the chat encoder: a chat-client option, which
# RequestContext (proxy/hub/canonical.py) does not carry, and a class of the compiled build (setup.py) cannot be
# subclassed here to add it. Each context is held as well, so that its id stays its own.
_INCLUDE_USAGE: dict[int, tuple[RequestContext, bool]] = {}


def request_context(
    kind: str,
    model: str,
    upstream: UpstreamSettings,
    *,
    stream: bool = False,
    include_usage: bool = False,
    client_model: str | None = None,
    response_id: str = "chatcmpl-ours",
    created: int = 7,
) -> RequestContext:
    ctx = RequestContext(
        kind=kind,
        request_id="rid",
        client_model=client_model or model,
        upstream_model=model,
        upstream=upstream,
        stream=stream,
        response_id=response_id,
        created=created,
    )
    _INCLUDE_USAGE[id(ctx)] = (ctx, include_usage)
    return ctx


def include_usage(c: RequestContext) -> bool:
    held = _INCLUDE_USAGE.get(id(c))
    return held is not None and held[0] is c and held[1]


class Run:
    """What one answer left behind besides the client's bytes (for assertions about metrics inputs)."""

    def __init__(self, session: UpstreamSession, answer: Answer) -> None:
        self.session = session
        self.answer = answer

    @property
    def usage(self) -> dict[str, Any] | None:
        return self.answer.usage

    @property
    def usage_extras(self) -> dict[str, Any]:
        return {**self.answer.usage_extras, **self.session.extras}

    @property
    def rewrites(self) -> int:
        return int(getattr(self.session, "rewrites", 0))

    @property
    def full_text_mismatch(self) -> bool:
        return bool(getattr(self.session, "full_text_mismatch", False))


def _encoder(c: RequestContext, answer: Answer, client: ClientSettings | None, stream: bool) -> ChatEncoder:
    client = client or ClientSettings()
    return chat_encoder(
        c,
        answer,
        stream,
        include_usage(c),
        client.reasoning,
        dialect_usage_fields(client.usage_fields),
        c.kind == "chat",
    )


def chunks_of(raw: bytes) -> list[dict[str, Any]]:
    events = SSEDecoder().feed(raw)
    return [orjson.loads(e.data) for e in events if e.data != "[DONE]"]


def relay(
    pieces: list[bytes],
    c: RequestContext,
    dialect: Dialect,
    client: ClientSettings | None = None,
    session: UpstreamSession | None = None,
) -> tuple[list[dict[str, Any]], Run]:
    """Upstream stream bytes, in the given pieces -> client chunks (usage chunk included). Raises what the proxy
    would turn into an error (the chunks before it are lost to the caller, as they are sent before the error).
    `session`: one that already built the request (its state, e.g. the thinking switch, matters)."""
    session = session or dialect.session(c)
    answer = Answer()
    out = drive(pieces, Pipeline(session, answer), _encoder(c, answer, client, True), end=ChatClient.stream_end)
    return chunks_of(out), Run(session, answer)


def drive(pieces: list[bytes], pipeline: Pipeline, encoder: Encoder, stream: bool = True,
          end: bytes | None = None) -> bytes:
    """Upstream stream bytes, in the given pieces, through a pipeline and any client encoder (as the handler
    does, without I/O) -> the client's body, framed as the HTTP sink frames it (SSE): streaming, the head, what each
    piece produced, the closing events and the client dialect's `stream_end` (`end`); not streaming, the folded
    body."""
    out: list[Event] = []
    events: list[Delta] = []
    for piece in pieces:
        pipeline.feed(piece, events)
        out += encoder.feed(events)
        events.clear()
    pipeline.finish(events)
    out += encoder.feed(events)
    if not stream:
        (whole,) = encoder.finish()
        return whole.data
    tail = [] if end is None else [Event(None, end)]
    return encode_events([*encoder.head(), *out, *encoder.finish(), *tail])


def complete(
    data: Any,
    c: RequestContext,
    dialect: Dialect,
    client: ClientSettings | None = None,
) -> dict[str, Any]:
    """A non-stream upstream JSON answer -> the client's JSON answer."""
    return complete_run(data, c, dialect, client)[0]


def complete_run(
    data: Any,
    c: RequestContext,
    dialect: Dialect,
    client: ClientSettings | None = None,
) -> tuple[dict[str, Any], Run]:
    session = dialect.session(c)
    answer = Answer()
    pipeline = Pipeline(session, answer)
    encoder = _encoder(c, answer, client, False)
    events: list[Delta] = []
    pipeline.feed_body(orjson.dumps(data), events)
    pipeline.finish(events)
    encoder.feed(events)
    (whole,) = encoder.finish()
    result: dict[str, Any] = orjson.loads(whole.data)
    return result, Run(session, answer)
