"""The request part of a spoke, and the `Dialect` that composes the parts.

A dialect is a spoke of the hub: it turns a canonical (OpenAI) request into the upstream's body, and the upstream's
answers — JSON bodies, stream events, errors in any shape — into canonical ones. The `Dialect` is built once per
upstream and holds no per-request state; `Dialect.session(ctx)` makes an `UpstreamSession` per request, which owns
the dialect's stateful quirks (MindIE's cumulative text, error finish reasons, whether the model starts inside a
thinking block) and hands canonical chunks — true deltas — to the shared normalizer (proxy/hub/normalize.py).

A spoke composes four parts, each with plain defaults (OpenAI's behaviour), and sets only what differs: the request
(`rules`, a `RequestRules`; `build_request`; `session_class`), its error shape (`errors_class`,
proxy/dialects/error_shape.py), its readiness check (`readiness_class`, proxy/dialects/readiness.py) and what the probe
knows of it (`probe`, proxy/dialects/probing.py). The data that differs lives in mappings/<name>.yaml.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final

from proxy.dialects.engine_metrics import EngineMetricNames
from proxy.dialects.error_shape import ErrorShape
from proxy.dialects.mapping import DialectMapping, load_mapping
from proxy.dialects.probing import Probe
from proxy.dialects.readiness import Readiness
from proxy.dialects.templates import is_r1_era, is_thinking_model
from proxy.errors import ClientRequestError, StreamTruncated, UpstreamError
from proxy.hub.canonical import CHAT, ChatChunk, ChatRequest, RequestContext, check_chunk
from proxy.hub.events import Timings
from proxy.hub.params import apply_response_format, refuse_unsupported
from proxy.hub.retrieval import OpenAIWire
from proxy.hub.structured import StructuredCaps

if TYPE_CHECKING:
    from proxy.gateway.catalog import ModelCatalog
    from proxy.hub.retrieval import RetrievalWire

# Finish reasons that say the upstream broke the generation off, not that the answer is complete
# (docs/deepseek-engine.md): a retryable error instead of a finish_reason — the whole answer for non-stream
# requests; for streams an error event after the partial content, without [DONE]. Any dialect may report them.
ERROR_FINISH_REASONS: Final[dict[str, tuple[int, str]]] = {
    "insufficient_system_resource": (
        503,
        (
            "The upstream interrupted the generation for lack of system resources "
            "(finish_reason `insufficient_system_resource`)"
        ),
    ),
}


def finish_error(finish: str, stream: bool) -> UpstreamError:
    status, text = ERROR_FINISH_REASONS[finish]
    if stream:
        return StreamTruncated(
            text + "; the answer streamed so far is incomplete. Retry the request.",
            reason="upstream_error",
            status=status,
            code=finish,
            upstream_code=finish,
        )
    return UpstreamError(
        text + "; the partial answer was discarded. Retry the request.", status, code=finish, upstream_code=finish
    )


class NativeRoute:
    """Where an upstream serves a client dialect as it is (mappings/<name>.yaml `native`), for native passthrough
    (proxy/endpoint/passthrough.py): the path, and how the upstream's key goes with the request — `bearer`
    (Authorization: Bearer) or the name of a header that carries the key as it is (an Anthropic-style `x-api-key`)."""

    __slots__ = ("auth", "path")

    def __init__(self, path: str, auth: str = "bearer") -> None:
        self.path = path
        self.auth = auth


def native_routes(dialect: str) -> dict[str, NativeRoute]:
    """The `native` section of a dialect's mapping: client dialect name -> its route. An entry is a path, or a
    mapping with `path` and `auth`."""
    raw = load_mapping(dialect).raw.get("native") or {}
    out: dict[str, NativeRoute] = {}
    for client, entry in raw.items():
        if isinstance(entry, str):
            out[client] = NativeRoute(entry)
        else:
            out[client] = NativeRoute(entry["path"], entry.get("auth", "bearer"))
    return out


class RequestRules:
    """The plain facts `Dialect.build_request` and the session go by: a spoke sets `Dialect.rules` to one made with
    those that differ from OpenAI's."""

    __slots__ = ("reasoning_fallback", "reasoning_source", "response_format", "response_format_hint",
                 "stream_usage_option", "structured", "supports_prefix")

    def __init__(self, *, reasoning_source: str = "auto", stream_usage_option: bool = True,
                 supports_prefix: bool = False, response_format: str = "pass",
                 response_format_hint: str = "Set `response_format: pass` for this upstream if it honours it.",
                 reasoning_fallback: str | None = None, structured: StructuredCaps | None = None) -> None:
        # Where the upstream keeps reasoning unless the config says otherwise (docs/decisions.md "Reasoning").
        self.reasoning_source = reasoning_source
        # Ask the upstream for usage on streams even when the client did not (metrics need tokens).
        self.stream_usage_option = stream_usage_option
        # DeepSeek's assistant-prefix continuation (`prefix: true` on the last message); refused with a 400 elsewhere.
        self.supports_prefix = supports_prefix
        # `response_format` unless the upstream's config says otherwise (proxy/hub/params.py): pass | emulate |
        # reject | drop, and the advice that goes with a refusal.
        self.response_format = response_format
        self.response_format_hint = response_format_hint
        # What the upstream offers when structured output is emulated (proxy/hub/structured.py): a tool it can be
        # forced to call, strict function calling, a JSON mode.
        self.structured = StructuredCaps() if structured is None else structured
        # What proxy/hub/continuity.py puts on an assistant tool-call turn whose reasoning it never saw, when the
        # upstream needs one there (DeepSeek's thinking mode); None: the turn is left as it is.
        self.reasoning_fallback = reasoning_fallback


class Dialect:
    name: ClassVar[str]  # the registry key: the spoke module's own name (proxy/dialects/__init__.py)
    # -- the parts a spoke composes (each with plain defaults; a spoke sets its own where it differs) ---------------
    # The request: the plain rules `build_request` goes by, and the per-request session that decodes the answers.
    rules: ClassVar[RequestRules] = RequestRules()
    session_class: ClassVar[type[UpstreamSession]]

    # How its upstream's errors read (proxy/dialects/error_shape.py); made per Dialect with its mapping: `errors`.
    errors_class: ClassVar[type[ErrorShape]] = ErrorShape
    # How /readyz asks it (proxy/dialects/readiness.py); made per Dialect: `readiness`.
    readiness_class: ClassVar[type[Readiness]] = Readiness
    # What `dialect-proxy probe` knows of its servers (proxy/dialects/probing.py); read from the class.
    probe: ClassVar[Probe] = Probe()

    # -- the upstream as a whole ----------------------------------------------------------------------------------
    # `prepare` runs before each request is built (a dialect whose translation depends on its upstream's model list).
    prepares: ClassVar[bool] = False

    # Where its engine tells its own load (proxy/dialects/engine_metrics.py): the names in its metrics exposition that
    # the Model Server Protocol gauges are made from (proxy/metrics/model_server.py); None: not known for this dialect.
    engine_metrics: ClassVar[EngineMetricNames | None] = None
    # The path that answers 2xx once the engine takes requests (MindIE's /v2/health/ready): what /readyz follows in
    # pool-member mode when no health_url is set (proxy/gateway/health.py); None: its health path, if any.
    ready_path: ClassVar[str | None] = None

    # The upstream has a mode that streams cumulative text (MindIE's fullTextEnabled): `full_text: true` says it is on.
    full_text_mode: ClassVar[bool] = False

    # `client.usage_fields: <name>` (proxy/clients/chat.py): chat clients may ask for this dialect's usage fields.
    offers_usage_fields: ClassVar[bool] = False

    @classmethod
    def client_usage_fields(cls) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
        """What turns an OpenAI usage into this dialect's own for chat clients that ask (None: it is OpenAI's)."""
        return None

    @classmethod
    def native_routes(cls) -> dict[str, NativeRoute]:
        """The client dialects this upstream serves natively, by name (what `passthrough` may name)."""
        return native_routes(cls.name)

    def __init__(self) -> None:
        self.mapping: DialectMapping = load_mapping(self.name)
        self.errors: ErrorShape = self.errors_class(self.mapping)
        self.readiness: Readiness = self.readiness_class(self.name, self.mapping, self.errors)
        # The upstream's own model list (proxy/gateway/catalog.py), attached by the app (proxy/server/appstate.py);
        # None: not known.
        self.catalog: ModelCatalog | None = None
        # What live traffic showed to be wrong with this upstream's configuration (one Dialect per upstream), e.g. a
        # stream of the other form than `full_text` says: /readyz reports it until the config is fixed.
        self.finding: str | None = None

    async def prepare(self, ctx: RequestContext) -> None:
        """Before the request is built, when `prepares`: learn what the translation needs from the upstream."""
        return None

    def routable_models(self, listed: tuple[str, ...]) -> list[str]:
        """The names that route to this upstream's models, given the names it lists itself (`/v1/models`)."""
        return list(listed)

    def reasoning_replay(self, body: ChatRequest, ctx: RequestContext) -> str:
        """What the hub does with the reasoning on this request's assistant turns (proxy/hub/continuity.py): `strip`,
        `keep` or `restore`. `auto`: R1-era models (they refuse or mis-read it) strip, others keep."""
        mode = ctx.upstream.reasoning_replay
        if mode != "auto":
            return mode
        return "strip" if is_r1_era(ctx.upstream_model) else "keep"

    # -- requests ---------------------------------------------------------------------------------------------
    def response_format_mode(self, ctx: RequestContext) -> str:
        """What this upstream does with a client's `response_format` (proxy/hub/params.py)."""
        return ctx.upstream.response_format or self.rules.response_format

    def structured_caps(self, body: ChatRequest, ctx: RequestContext) -> StructuredCaps:
        """What the upstream offers this request for emulated structured output (a spoke whose modes differ, such
        as a thinking mode that refuses a forced tool, says so per request)."""
        return self.rules.structured

    def path(self, kind: str) -> str | None:
        return self.mapping.paths.get(kind)

    def build_request(self, body: ChatRequest, ctx: RequestContext) -> dict[str, Any]:
        rules = self.rules
        if not rules.supports_prefix and ctx.kind == CHAT:
            _refuse_prefix(body, ctx)
        body = refuse_unsupported(body, self.mapping.refuse, ctx.upstream.name)
        body = apply_response_format(body, self.response_format_mode(ctx), ctx.upstream.name, self.name,
                                     rules.response_format_hint, rules.structured.json_mode)
        out = self.mapping.apply_request(body)
        out["model"] = ctx.upstream_model
        if ctx.stream and rules.stream_usage_option:
            opts = dict(out.get("stream_options") or {})
            opts["include_usage"] = True
            out["stream_options"] = opts
        return out

    def retrieval_wire(self) -> RetrievalWire:
        """How this upstream is asked for embeddings and rerank (proxy/hub/retrieval.py): OpenAI's and Cohere's
        shapes on the mapping's paths, unless the spoke speaks otherwise."""
        return OpenAIWire(self.path("embeddings") or "/v1/embeddings", self.path("rerank") or "/v1/rerank")

    def request_path(self, path: str, body: dict[str, Any], ctx: RequestContext) -> str:
        """The upstream path for this request's built body (DeepSeek sends prefix continuations to /beta)."""
        return path

    def request_headers(self, ctx: RequestContext) -> dict[str, str]:
        headers = {"x-request-id": ctx.request_id}
        if ctx.upstream.api_key:
            headers["Authorization"] = f"Bearer {ctx.upstream.api_key}"
        return headers

    # -- responses --------------------------------------------------------------------------------------------
    def timings(self, extras: Mapping[str, Any]) -> Timings | None:
        """The upstream's own timings of one answer from its upstream-only fields (`UpstreamSession.extras` and
        `Answer.usage_extras`, merged); None when the dialect reports none."""
        return None

    def session(self, ctx: RequestContext) -> UpstreamSession:
        """The per-request decoding session (the dialect's own stream state lives there)."""
        return self.session_class(self, ctx)

    def map_finish(self, choices: list[dict[str, Any]]) -> None:
        """The mapping's finish_reason renames (sessions call it only when the mapping has some)."""
        fmap = self.mapping.finish_reason
        if not fmap:
            return
        for ch in choices:
            fr = ch.get("finish_reason")
            if isinstance(fr, str) and fr in fmap:
                ch["finish_reason"] = fmap[fr]

    def decode_models(self, data: Any) -> list[dict[str, Any]]:
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            return [m for m in data["data"] if isinstance(m, dict) and isinstance(m.get("id"), str)]
        return []


class UpstreamSession:
    """One request's view of its upstream: builds the body and turns each upstream answer into canonical chunks.

    Canonical chunks are OpenAI chat (or completions) chunks whose text fields are true deltas. One entry, `chunk`,
    takes stream events and whole non-stream answers alike: a whole answer becomes one final chunk whose choices
    carry the message as their `delta` and their finish_reason, so that the rest of the pipeline is the same for
    both (docs/hub.md "Upstream side: one session entry").
    """

    def __init__(self, dialect: Dialect, ctx: RequestContext) -> None:
        self.dialect = dialect
        self.ctx = ctx
        self.extras: dict[str, Any] = {}  # upstream-only fields (MindIE timings ...) for the metrics layer
        self.reasoning_source = ctx.upstream.reasoning_source or dialect.rules.reasoning_source
        self.thinking_off = False  # the request switched thinking off (set by a dialect's build_request)
        self._pending: UpstreamError | None = None  # an error finish reason, raised after its partial content
        # Looked up once per request, not per chunk: the stream path runs `chunk` for every upstream event.
        self._error_in_json = dialect.errors.in_json
        self._strip_keys = dialect.mapping.strip
        self._finish_map = dialect.mapping.finish_reason

    # -- requests ---------------------------------------------------------------------------------------------
    def build_request(self, body: ChatRequest) -> dict[str, Any]:
        return self.dialect.build_request(body, self.ctx)

    @property
    def starts_in_reasoning(self) -> bool:
        """The model's answer starts inside a `<think>` block whose opening tag is in the prompt template."""
        if self.reasoning_source not in ("auto", "tags"):
            return False
        if self.thinking_off:
            # The request switched thinking off (MindIE's `chat_template_kwargs.enable_thinking: false`): the
            # template opens no block, for R1-family names too, and the whole answer is text (docs/mindie.md).
            return False
        model = self.ctx.upstream_model
        return is_thinking_model(model) or model in self.ctx.upstream.thinking_models

    # -- answers ----------------------------------------------------------------------------------------------
    def chunk(self, data: Any, whole: bool = False) -> ChatChunk | None:
        """One parsed upstream answer -> a canonical chunk (None: nothing for the client).

        `data` is a stream event, or (`whole`) a non-stream JSON answer, which becomes one final chunk whose choices
        carry their message as their `delta`: the rest of the pipeline is the same for both. An error the upstream
        reports mid-stream is a StreamTruncated (the client may have part of the answer); in a whole answer it is
        the dialect's error itself, and an error finish reason discards the partial answer."""
        if self._pending is not None:
            raise self._pending
        err = self._error_in_json(data)
        if err is not None:
            if whole:
                raise err
            raise StreamTruncated(
                err.message,
                reason="upstream_error",
                status=err.status,
                type=err.type,
                code=err.code,
                upstream_code=err.upstream_code,
            )
        chunk: ChatChunk
        if whole:
            chunk = self._whole(data)
        elif isinstance(data, dict):
            chunk = data
        else:
            raise StreamTruncated("The upstream sent a stream event that is not a JSON object.", reason="invalid_data")
        if self._strip_keys:
            self._strip(chunk)
        choices = check_chunk(chunk, self.ctx.kind == CHAT)  # the shapes read here and in the normaliser
        if choices:
            if self._finish_map:
                self.dialect.map_finish(choices)
            for choice in choices:
                finish = choice.get("finish_reason")
                if finish is not None and finish in ERROR_FINISH_REASONS:
                    if whole:
                        raise finish_error(finish, stream=False)
                    # The partial content of this chunk still reaches the client; the error follows it.
                    choice["finish_reason"] = None
                    if self._pending is None:
                        self._pending = finish_error(finish, stream=True)
        return chunk

    def _whole(self, data: Any) -> ChatChunk:
        """A non-stream answer's choices as a final chunk's: each message becomes its choice's delta."""
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise UpstreamError("The upstream answered with JSON that is not a completion.", 502)
        chat = self.ctx.kind == CHAT
        choices = []
        for choice in data["choices"]:
            if not isinstance(choice, dict):
                continue
            out = {k: v for k, v in choice.items() if k != "message"}
            if chat:
                message = choice.get("message")
                out["delta"] = message if isinstance(message, dict) else {}
            choices.append(out)
        data["choices"] = choices
        return data

    # A session whose `chunk` turns a plain event's text into other text (MindIE's cumulative snapshots) sets this and
    # answers `lane_text` as its `chunk` would.
    rewrites_text = False

    # A session that may find a stream's first texts unsound (MindIE: a stream of the other form than `full_text`
    # says) sets `settling` until it knows: meanwhile the pipeline holds the events back while `holds()` and then
    # hands them on, or drops them for the error that ends the stream (proxy/hub/pipeline.py).
    settling = False

    def holds(self) -> bool:
        """The events so far must wait: a text came whose soundness is not known yet."""
        return False

    def lane_open(self) -> bool:
        """A plain text event may skip `chunk` now (proxy/stream/text_lane.py): no error waits to be raised. A session
        whose events are reshaped beyond their text says it never is."""
        return self._pending is None

    def lane_text(self, index: int, text: str, reasoning: bool) -> str:
        """What `chunk` makes of a plain text event's text (content, or a reasoning field): here, the text itself."""
        return text

    def end(self) -> None:
        """The upstream stream is over: raise what the dialect knows is wrong with the answer."""
        if self._pending is not None:
            raise self._pending

    def _strip(self, data: dict[str, Any]) -> None:
        for key in self._strip_keys:
            if key in data:
                self.extras[key] = data.pop(key)


Dialect.session_class = UpstreamSession


def join_text_parts(content: Any) -> Any:
    """OpenAI content parts that are all text -> one string (joined with newlines, as chat templates do); any other
    content is returned unchanged. For upstreams whose messages take string content only."""
    if (
        isinstance(content, list)
        and content
        and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content)
    ):
        return "\n".join(p["text"] for p in content)
    return content


def _refuse_prefix(body: ChatRequest, ctx: RequestContext) -> None:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    for i, message in enumerate(messages):
        if isinstance(message, dict) and message.get("prefix") is True:
            raise ClientRequestError(
                f"messages[{i}].prefix: the assistant-prefix continuation (DeepSeek's `prefix: true`) is not "
                f"supported by the upstream `{ctx.upstream.name}` ({ctx.upstream.dialect} dialect).",
                param=f"messages[{i}].prefix",
            )
