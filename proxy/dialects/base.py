"""The Dialect protocol, and the behaviour shared by OpenAI-like dialects.

A dialect is a spoke of the hub: it turns a canonical (OpenAI) request into the upstream's body, and the upstream's
answers — JSON bodies, stream events, errors in any shape — into canonical ones. The `Dialect` is built once per
upstream and holds no per-request state; `Dialect.session(ctx)` makes an `UpstreamSession` per request, which owns
the dialect's stateful quirks (MindIE's cumulative text, error finish reasons, whether the model starts inside a
thinking block) and hands canonical chunks — true deltas — to the shared normalizer (proxy/hub/normalize.py).

Subclasses override only what differs; the data that differs lives in mappings/<name>.yaml.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final

import orjson

from proxy.dialects.mapping import DialectMapping, load_mapping
from proxy.errors import ClientRequestError, ProxyError, StreamTruncated, UpstreamError, error_type_for
from proxy.hub.canonical import CHAT, ChatChunk, ChatRequest, RequestContext
from proxy.hub.events import Timings
from proxy.hub.params import apply_response_format, refuse_unsupported
from proxy.hub.retrieval import OpenAIWire

if TYPE_CHECKING:
    from proxy.gateway.catalog import ModelCatalog
    from proxy.hub.retrieval import RetrievalWire
    from proxy.settings import UpstreamSettings

MAX_ERROR_TEXT: Final = 500

# An upstream's 404 that is about the model, not the path: OpenAI's code, or words such as "The model `x` does not
# exist", "Model Not Exist", "model not found" (MindIE's own wording: proxy/dialects/mindie.py).
_MODEL_MISSING: Final = re.compile(r"(?i)\bmodel\b.{0,120}?(not[ _]?(found|exist)|does not exist|unknown)|"
                                   r"(unknown|invalid) model")
# The readiness request's `messages`: not a list, so that every dialect's validation refuses the body before any
# generation (proxy/gateway/health.py).
READINESS_MESSAGES: Final = "readiness check from dialect-proxy: an invalid body on purpose"

# DECISIONS.md "Reasoning": upstream model names whose template opens the thinking block in the prompt (R1 family).
THINKING_MODEL_RE: Final = re.compile(r"(?i)(^|[^a-z0-9])r1([^a-z0-9]|$)|reasoner")
# R1-era models (DeepSeek-R1 and its distills): reasoning must never be sent back to them. Not `reasoner`: DeepSeek's
# `deepseek-reasoner` ended as an alias of V4 Flash's thinking mode (proxy/dialects/deepseek.py).
R1_MODEL_RE: Final = re.compile(r"(?i)(^|[^a-z0-9])r1([^a-z0-9]|$)")


class NameTest:
    """A pattern's verdict on model names, remembered: a request names one of a few models, and a dict lookup costs
    a small part of a search. Bounded: forgotten all at once at `limit` names."""

    __slots__ = ("_limit", "_pattern", "_seen")

    def __init__(self, pattern: re.Pattern[str], limit: int = 4096) -> None:
        self._pattern = pattern
        self._seen: dict[str, bool] = {}
        self._limit = limit

    def __call__(self, name: str) -> bool:
        verdict = self._seen.get(name)
        if verdict is None:
            if len(self._seen) >= self._limit:
                self._seen.clear()
            verdict = self._seen[name] = self._pattern.search(name) is not None
        return verdict


is_thinking_model: Final = NameTest(THINKING_MODEL_RE)
is_r1_era: Final = NameTest(R1_MODEL_RE)

# -- the thinking switch of Hugging Face chat templates (servers that render them: MindIE, vLLM) ---------------------
# OpenAI reasoning_effort values; "none" and "minimal" ask for (next to) no thinking, which a template can only switch
# off.
EFFORT_OFF: Final = frozenset({"none", "minimal"})
EFFORT_ON: Final = frozenset({"low", "medium", "high", "xhigh"})
# Chat templates whose thinking switch is the `thinking` kwarg (DeepSeek V3.1 and later); others (Qwen3, GLM ...)
# read `enable_thinking`.
_THINKING_KWARG_MODELS: Final = re.compile(r"(?i)deepseek[-_ ]?v3\.[1-9]|deepseek[-_ ]?v4")
# Thinking models whose chat templates render the reasoning of the current tool loop's assistant turns (Qwen3 keeps
# `reasoning_content` after the last user query; DeepSeek V3.1+ and GLM-4.5+ interleave it with tool calls): a client
# that drops it changes the prompt, so `reasoning_replay: auto` restores it (proxy/hub/continuity.py).
_INTERLEAVED_THINKING: Final = re.compile(r"(?i)qwen3|deepseek[-_ ]?v3\.[1-9]|deepseek[-_ ]?v4|glm-?4\.[5-9]|kimi-k2")
interleaved_thinking: Final = NameTest(_INTERLEAVED_THINKING)  # asked once per request
_thinking_kwarg_model: Final = NameTest(_THINKING_KWARG_MODELS)


def thinking_kwarg(model: str) -> str:
    """The chat_template_kwargs key that switches this model's thinking."""
    return "thinking" if _thinking_kwarg_model(model) else "enable_thinking"


def set_template_thinking(body: dict[str, Any], model: str) -> None:
    """The client's reasoning switch (`template_thinking`) into `chat_template_kwargs`, under the key the model's
    template reads, unless the client put that key there itself (its other keys go through). `body` is the caller's
    own copy."""
    enable = template_thinking(body)
    if enable is not None:
        kwargs = body.get("chat_template_kwargs")
        kwargs = dict(kwargs) if isinstance(kwargs, dict) else {}
        kwargs.setdefault(thinking_kwarg(model), enable)
        body["chat_template_kwargs"] = kwargs


def template_thinking(body: dict[str, Any]) -> bool | None:
    """The chat template's thinking switch from `thinking`, a top-level `enable_thinking` or `reasoning_effort`
    (in that order of precedence); None when the client said nothing."""
    thinking = body.get("thinking")
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind in ("enabled", "disabled"):
            return bool(kind == "enabled")
        raise ClientRequestError(
            f'`thinking` must be {{"type": "enabled"}} or {{"type": "disabled"}}, got {thinking!r}.', param="thinking"
        )
    flag = body.get("enable_thinking")
    if flag is not None:
        if not isinstance(flag, bool):
            raise ClientRequestError(f"`enable_thinking` must be a boolean, got {flag!r}.", param="enable_thinking")
        return flag
    effort = body.get("reasoning_effort")
    if effort is None:
        return None
    if effort in EFFORT_OFF:
        return False
    if effort in EFFORT_ON:
        return True
    raise ClientRequestError(
        f"`reasoning_effort` must be one of none, minimal, low, medium, high; got {effort!r}.", param="reasoning_effort"
    )

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


@dataclass(slots=True)
class ProbeListing:
    """What `dialect-proxy probe` (proxy/probe/runner.py) learnt from a server's model-listing paths, for each spoke to
    recognise its own servers by (`Dialect.probe_listing`). Shapes are error-body shapes, named after the dialect
    whose servers answer with them (`Dialect.probe_error_shape`), or generic ones (`json`, `text`, ...). Made once
    per probe: its generated `__init__` may run interpreted (tests/test_build.py)."""

    status: int  # of the first listing path asked (the dialect's own, or /v1/models)
    body_shape: str  # its body's shape, whatever the status
    error_shape: str | None  # its body's shape when it is an error other than 404/405, else None
    owners: set[str]  # the `owned_by` of the models it listed
    listed: bool  # it listed models (OpenAI's list shape)
    plain_listed: bool  # `GET /models` (no /v1) listed models too


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


class Dialect:
    name: ClassVar[str]  # the registry key: the spoke module's own name (proxy/dialects/__init__.py)
    session_class: ClassVar[type[UpstreamSession]]
    # Where the upstream keeps reasoning unless the config says otherwise (DECISIONS.md "Reasoning").
    default_reasoning_source: ClassVar[str] = "auto"
    # Ask the upstream for usage on streams even when the client did not (metrics need tokens).
    stream_usage_option: ClassVar[bool] = True
    # DeepSeek's assistant-prefix continuation (`prefix: true` on the last message); refused with a 400 elsewhere.
    supports_prefix: ClassVar[bool] = False
    # `response_format` unless the upstream's config says otherwise (proxy/hub/params.py): pass | reject | drop.
    default_response_format: ClassVar[str] = "pass"
    response_format_hint: ClassVar[str] = "Set `response_format: pass` for this upstream if it honours it."

    # What proxy/hub/continuity.py puts on an assistant tool-call turn whose reasoning it never saw, when the upstream
    # needs one there (DeepSeek's thinking mode); None: the turn is left as it is.
    reasoning_fallback: ClassVar[str | None] = None

    # `prepare` runs before each request is built (a dialect whose translation depends on its upstream's model list).
    prepares: ClassVar[bool] = False

    # The upstream has a mode that streams cumulative text (MindIE's fullTextEnabled): `full_text: true` says it is on.
    full_text_mode: ClassVar[bool] = False

    # -- `dialect-proxy probe` (proxy/probe/runner.py asks every spoke; none of this runs on requests) --------------
    # Recognised only when no other spoke is: the OpenAI-compatible server every detection falls back to.
    probe_generic: ClassVar[bool] = False
    # Chat requests carry `model` (the probe's too).
    sends_model: ClassVar[bool] = True
    # A server of this dialect without a model listing is recognised on its chat path: "stream" (a small streamed
    # request, kept as the probe's chat answer), "invalid" (a body invalid on purpose, whose validation error in the
    # generic spoke's shape proves the path) or None (not tried).
    probe_chat_path: ClassVar[str | None] = None
    # The probe asks whether the server honours `response_format` (servers of some versions do; the config block
    # then says `response_format: pass`).
    probe_structured_output: ClassVar[bool] = False
    # This dialect's error shape is an error even in a 2xx answer.
    probe_error_at_200: ClassVar[bool] = False

    @classmethod
    def probe_error_shape(cls, data: dict[str, Any]) -> bool:
        """The error body is in the shape this dialect's own servers answer with (one spoke per shape; a dialect
        whose errors look like another's claims none)."""
        return False

    @classmethod
    def probe_refused_key(cls, raw: bytes) -> bool:
        """An error body of this dialect's shape says the API key was refused (whatever the HTTP status)."""
        return False

    @classmethod
    def probe_listing(cls, listing: ProbeListing) -> str | None:
        """The evidence that the server speaks this dialect, from its model-listing paths; None: no such evidence."""
        return None

    @classmethod
    def probe_after_chat(cls, events: list[dict[str, Any]], usage_seen: bool) -> str | None:
        """The evidence, from a streamed chat answer, that a server found to speak another member of this dialect's
        family (proxy/dialects/__init__.py `family`) is this one; None: no such evidence."""
        return None

    @classmethod
    def probe_chat_body(cls, body: dict[str, Any], tools: bool) -> None:
        """What this dialect adds to the probe's small chat request (`tools`: the one that forces a tool call)."""
        return None

    @classmethod
    def probe_config_notes(cls, url: str) -> list[str]:
        """Comment lines for the config block the probe suggests for a server at `url` (indented as its entry)."""
        return []

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
    def path(self, kind: str) -> str | None:
        return self.mapping.paths.get(kind)

    def build_request(self, body: ChatRequest, ctx: RequestContext) -> dict[str, Any]:
        if not self.supports_prefix and ctx.kind == CHAT:
            _refuse_prefix(body, ctx)
        body = refuse_unsupported(body, self.mapping.refuse, ctx.upstream.name)
        mode = ctx.upstream.response_format or self.default_response_format
        body = apply_response_format(body, mode, ctx.upstream.name, self.name, self.response_format_hint)
        out = self.mapping.apply_request(body)
        out["model"] = ctx.upstream_model
        if ctx.stream and self.stream_usage_option:
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

    # -- readiness (proxy/gateway/health.py)
    # ----------------------------------------------------------------------------
    def readiness_request(self, u: UpstreamSettings) -> tuple[str, dict[str, Any]]:
        """(path, body) of the request that tells whether a request would work, without generating anything: a chat
        body the upstream must refuse as invalid (`messages` is not a list), on the chat path."""
        return self.path("chat") or "/v1/chat/completions", {
            "model": readiness_model(u), "messages": READINESS_MESSAGES, "max_tokens": 1, "stream": False}

    def readiness_headers(self, u: UpstreamSettings) -> dict[str, str]:
        return {"Authorization": f"Bearer {u.api_key}"} if u.api_key else {}

    def readiness_verdict(self, status: int, raw: bytes, path: str, u: UpstreamSettings) -> tuple[bool, str]:
        """(ready, why) from the answer to `readiness_request`, read as a client's answer would be (this dialect's
        error shapes and mapping, errors at HTTP 200 included). Its validation error (or a model the upstream does
        not know: a per-request matter) is ready; a missing path, a refused key, a 5xx is not."""
        asked = f"POST {path} (an invalid body on purpose)"
        err: ProxyError | None
        if 200 <= status < 300:
            try:
                data = orjson.loads(raw)
            except orjson.JSONDecodeError:
                data = None
            err = self.error_in_json(data)
            if err is None:
                return True, f"{asked} answered HTTP {status}: the path and the key work"
        else:
            err = self.error_from_body(status, raw)
        said = f"{asked} answered HTTP {status}: {_short(err.message)[:160]}"
        if status in (404, 405) and err.code != "model_not_found":
            return False, (f"{said} — no such inference path: the URL (host, port, path prefix) or the dialect "
                           f"({u.dialect}) is wrong; `dialect-proxy probe URL` tells what the upstream speaks")
        if err.status in (401, 403):
            fix = "check the variable named by api_key_env" if u.api_key else "set api_key_env"
            return False, f"{said} — the upstream refused the API key ({fix})"
        if err.status in (400, 413) or err.code == "model_not_found":
            return True, f"{said} — the {self.name} dialect's validation error: the path and the key work"
        if err.status == 429:
            return True, f"{said} — busy, but the path and the key work"
        if err.status == 402:
            return False, f"{said} — the account's balance or quota is exhausted"
        return False, f"{said} (expected the {self.name} dialect's validation error)"

    # -- errors -----------------------------------------------------------------------------------------------
    def answer_error(self, status: int, raw: bytes, headers: dict[str, str], path: str, upstream: str,
                     dialect: str) -> ProxyError:
        """The error of an inference request's answer (`error_from_body`), except that a 404 which is not about the
        model means the path does not exist there: a 502 naming the path and the configured dialect, never a
        `model_not_found` for a model that routing found."""
        err = self.error_from_body(status, raw, headers)
        if status == 404 and err.code != "model_not_found":
            return UpstreamError(
                f"{err.message} — the upstream `{upstream}` answered 404 Not Found on POST {path}: there is no such "
                f"path for the configured dialect `{dialect}`. Check the upstream's URL (host, port, path prefix) "
                f"and dialect; `dialect-proxy probe URL` tells which dialect it speaks.",
                502, code="upstream_path_not_found", upstream_code="404")
        return err

    def error_from_body(self, status: int, raw: bytes, headers: dict[str, str] | None = None) -> ProxyError:
        """An upstream answer with an error status (or an error body at 2xx) -> our error."""
        message, upstream_code, param = _extract_error_message(raw)
        if not message:
            message = f"The upstream returned HTTP {status} with an empty body."
        our_status = self.mapping.error_status.get(status, _default_status(status))
        err_type, code = error_type_for(our_status)
        if our_status == 404 and upstream_code != "model_not_found" and not _MODEL_MISSING.search(message):
            code = "not_found"  # (the path, most likely: answer_error)
        out_headers = {}
        if headers and our_status == 429 and headers.get("retry-after"):
            out_headers["Retry-After"] = headers["retry-after"]
        return UpstreamError(
            message,
            our_status,
            type=err_type,
            code=code,
            param=param,
            headers=out_headers,
            upstream_code=upstream_code or str(status),
        )

    def error_in_json(self, data: Any) -> ProxyError | None:
        """An error carried inside a 2xx JSON body or a stream event (None when `data` is not an error)."""
        if isinstance(data, dict) and "error" in data and "choices" not in data:
            raw = orjson.dumps(data)
            err = self.error_from_body(502, raw)
            status = _status_from_error_obj(data.get("error"))
            if status is not None:
                err.status = status
                err.type, err.code = error_type_for(status)
            return err
        return None

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
    both (docs/hub.md "One path").
    """

    def __init__(self, dialect: Dialect, ctx: RequestContext) -> None:
        self.dialect = dialect
        self.ctx = ctx
        self.extras: dict[str, Any] = {}  # upstream-only fields (MindIE timings ...) for the metrics layer
        self.reasoning_source = ctx.upstream.reasoning_source or dialect.default_reasoning_source
        self.thinking_off = False  # the request switched thinking off (set by a dialect's build_request)
        self._pending: UpstreamError | None = None  # an error finish reason, raised after its partial content
        # Looked up once per request, not per chunk: the stream path runs `chunk` for every upstream event.
        self._error_in_json = dialect.error_in_json
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
        choices = chunk.get("choices")
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


def readiness_model(u: UpstreamSettings) -> str:
    """A model name the upstream serves, as far as the config says (for requests that need one)."""
    for name in (*u.aliases.values(), *u.models):
        if name != "*":
            return name
    return "readiness-check"


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


def _default_status(status: int) -> int:
    if status == 422:
        return 400
    if status in (400, 401, 402, 403, 404, 408, 409, 413, 429):
        return status
    if 400 <= status < 500:
        return 400
    if status in (503, 504):
        return status
    return 502


def _status_from_error_obj(err: Any) -> int | None:
    if isinstance(err, dict):
        for key in ("status", "status_code", "code"):
            v = err.get(key)
            if isinstance(v, int) and 400 <= v <= 599:
                return _default_status(v)
    return None


def _extract_error_message(raw: bytes) -> tuple[str, str | None, str | None]:
    """(message, upstream code, param) from any error body shape we know; raw text is kept, shortened."""
    text = raw.strip()
    if not text:
        return "", None, None
    try:
        data = orjson.loads(text.decode("utf-8", "replace"))  # invalid UTF-8 becomes U+FFFD, as everywhere
    except orjson.JSONDecodeError:
        return _short(text.decode("utf-8", "replace")), None, None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):  # OpenAI / DeepSeek
            msg = err.get("message")
            code = err.get("code") if err.get("code") is not None else err.get("type")
            param = err.get("param") if isinstance(err.get("param"), str) else None
            return _short(str(msg if msg is not None else err)), None if code is None else str(code), param
        if isinstance(err, str):  # MindIE {"error": "...", "error_type": "..."}
            return _short(err), data.get("error_type") and str(data["error_type"]), None
        for key in ("message", "detail", "msg"):
            if isinstance(data.get(key), str):
                code = data.get("code")
                return _short(data[key]), None if code is None else str(code), None
    return _short(text.decode("utf-8", "replace")), None, None


def _short(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_ERROR_TEXT else text[:MAX_ERROR_TEXT] + "…"
