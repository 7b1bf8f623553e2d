"""The client-dialect spoke: how one client API (Chat Completions, Completions, Responses, Messages) reaches the hub
and how the hub's events reach that client. A client spoke knows no upstream dialect.

Per request:

    body ─▶ ClientDialect.decode() ─▶ ClientCall (canonical chat/completions request + what the encoder needs)
    Delta events ─▶ ClientDialect.encoder(call, ctx, answer) ─▶ the client's events ─▶ the transport's sink

Streaming and non-streaming share one path: an encoder is fed the same `Delta` events either way and emits the
client's events (proxy/hub/sse.py `Event`: an event name and a JSON payload, never framed here) to a consumer the
client dialect picks per request — a writer (`feed` returns the events to send at once) or a fold (`feed` returns
none, `finish` one event: the whole JSON object); the transport's sink frames them (docs/hub.md).

Errors: before the stream head an error is an HTTP status with the client's own envelope (`error_response`); after
it, `Encoder.error` renders the in-stream error that makes the client's SDK raise (never a silent end).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from proxy.clients.ratelimit import openai_headers

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

    from proxy.clients.native import NativeReader
    from proxy.errors import ProxyError
    from proxy.gateway.limits import LimitView
    from proxy.hub.canonical import ChatRequest, RequestContext
    from proxy.hub.events import Answer, Delta
    from proxy.hub.sse import Event
    from proxy.settings import Settings
    from proxy.state.base import StateStore

Headers = list[tuple[bytes, bytes]]


class ClientCall:
    """One decoded client request. Each client dialect's call is a subclass that adds, as typed fields, what its
    encoder and its `completed` need again (proxy/clients/chat.py ChatCall, responses.py ResponsesCall,
    messages_encoder.py MessagesCall)."""

    request: ChatRequest  # the hub request: Chat Completions shape (kind "chat") or Completions shape ("completions")
    kind: str  # canonical.CHAT or canonical.COMPLETIONS: what the upstream is asked for
    model: str  # the model name the client asked for (routing happens on it)
    stream: bool
    # Response headers the client spoke adds (e.g. the hosted tools left out of the upstream request).
    headers: Headers
    # One fact of the client spoke's for the access log line, as (key, value): the Responses hosted tools left out
    # ("ignored_tools"), the Anthropic thinking blocks left out unverified ("unverified_thinking").
    log_note: tuple[str, str | int] | None

    def __init__(self, request: ChatRequest, kind: str, model: str, stream: bool,
                 headers: Headers | None = None) -> None:
        # Written out, as Delta's (proxy/hub/events.py): compiled, a generated `__init__` runs interpreted.
        self.request = request
        self.kind = kind
        self.model = model
        self.stream = stream
        self.headers = [] if headers is None else headers
        self.log_note = None


class Outcome:
    """What a complete answer leaves for its client dialect to keep (`ClientDialect.completed`): the Responses API's
    stored response — its id, the record to store (the response object and the conversation to continue from), and
    whether the client asked to store it."""

    __slots__ = ("record", "response_id", "store")

    def __init__(self, response_id: str, record: dict[str, Any], store: bool) -> None:
        self.response_id = response_id
        self.record = record
        self.store = store


class Encoder(Protocol):
    # The client dialect's keep-alive event after a silence once the stream head is out (Anthropic's `ping`); None:
    # the transport's own (an SSE comment on HTTP, nothing on a WebSocket, whose front end pings).
    keepalive: Event | None

    def head(self) -> list[Event]:
        """Streaming: the events that open the client's stream (none for Chat Completions)."""

    def feed(self, deltas: Sequence[Delta]) -> list[Event]:
        """Streaming: the client's events for these hub events (maybe none). Non-streaming: accumulate, none."""

    def finish(self) -> list[Event]:
        """The answer is complete. Streaming: the closing events (the usage chunk, `response.completed`,
        `message_stop` ...; what the client dialect's `stream_end` declares follows them). Non-streaming: one event,
        the whole JSON object."""

    def error(self, err: ProxyError) -> Event:
        """Streaming, after the head: the in-stream error event for `err` (the stream then closes)."""

    def outcome(self) -> Outcome | None:
        """After `finish`: what the client dialect keeps of this answer (None: nothing)."""


CallT = TypeVar("CallT", bound=ClientCall)


class ClientDialect(Generic[CallT]):
    """One client API, built once per process, over its own call type `CallT` (what its `decode` makes and its
    `encoder` reads). Subclasses set `name` (the metrics `route` label), `path` and
    `id_prefix` (the handler sets `ctx.response_id` = id_prefix + random hex; encoders use ctx.response_id,
    ctx.created and ctx.response_model)."""

    name: ClassVar[str]
    path: ClassVar[str]
    id_prefix: ClassVar[str]
    content_type: ClassVar[bytes] = b"text/event-stream; charset=utf-8"
    # The payload of the plain event that ends a complete stream, after the encoder's closing events (Chat
    # Completions' `[DONE]`); None: the closing events end it. Never sent after an error event.
    stream_end: ClassVar[bytes | None] = None

    def __init__(self, settings: Settings, store: StateStore) -> None:
        self.settings = settings
        self.store = store

    async def decode(self, body: dict[str, Any]) -> CallT:
        """The client's JSON body (already parsed, a dict) -> a ClientCall. Raises ClientRequestError (400 naming the
        parameter) for what the client got wrong."""
        raise NotImplementedError

    def encoder(self, call: CallT, ctx: RequestContext, answer: Answer) -> Encoder:
        raise NotImplementedError

    def error_response(self, err: ProxyError) -> tuple[int, Headers, bytes]:
        """An error before the stream head (or for a non-stream request): status, headers, body."""
        raise NotImplementedError

    def rate_limit_headers(self, view: LimitView) -> Headers:
        """The headers that tell a limited key's client its limits (proxy/clients/ratelimit.py): OpenAI's."""
        return openai_headers(view)

    async def completed(self, outcome: Outcome) -> None:
        """A complete answer that leaves something to keep (`Encoder.outcome`), before its last bytes go to the
        client: store what must outlive the request."""

    # -- native passthrough (proxy/endpoint/passthrough.py): an upstream that serves this API as it is -----------------
    # Request headers of this API that go upstream with a passed-through request (never the client's credentials:
    # the upstream's own key replaces them).
    native_headers: ClassVar[tuple[bytes, ...]] = ()

    def native_reader(self) -> NativeReader | None:
        """A reader of this API's answers for passthrough; None: this API cannot be passed through."""
        return None

    def native_error(self, err: ProxyError) -> Event:
        """The in-stream error event for a failure of the proxy's own after a passed-through stream began (at an
        event boundary)."""
        raise NotImplementedError

    # -- a WebSocket mode (proxy/server/responses_socket.py: the Open Responses "WebSocket Transport") ---------------
    # True: the dialect's path also takes WebSocket connections, each message one request answered as a stream.
    websocket: ClassVar[bool] = False

    def for_socket(self, cache: dict[str, bytes]) -> ClientDialect[CallT]:
        """This client dialect for one WebSocket connection, with `cache` the connection's own state (response id ->
        stored record). Its events are the same as on HTTP: the socket's sink sends each payload as one message."""
        raise NotImplementedError

    def routes(self) -> list[BaseRoute]:
        """Routes besides the POST inference endpoint at `path` (GET/DELETE of stored objects, token counting ...);
        they go through Starlette, with the same API-key check."""
        return []


def openai_error_response(err: ProxyError) -> tuple[int, Headers, bytes]:
    """The OpenAI error envelope (Chat Completions, Completions, Responses)."""
    headers = [(k.lower().encode(), v.encode("latin-1", "replace")) for k, v in err.response_headers().items()]
    return err.status, headers, err.body()
