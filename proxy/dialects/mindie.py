"""Huawei MindIE Server (its OpenAI-style routes `/v1/chat/completions` and `/v1/completions`).

Requests: the declarative part (renames, dropped fields, ranges, integer checks) is mappings/mindie.yaml; here is what
must be computed, so that MindIE gets a body it accepts and a client gets a 400 naming the parameter instead of an
upstream 422:

- `developer` messages become `system` (MindIE knows four roles, and refuses `developer` outright when `tools` are
  present);
- OpenAI content parts `{"type": "image_url", "image_url": {"url": U}}` become MindIE's bare `"image_url": U` (also
  `video_url`, `audio_url`);
- `reasoning_effort`, DeepSeek-style `thinking: {"type": ...}` and a top-level `enable_thinking` become
  `chat_template_kwargs.enable_thinking` (an explicit `chat_template_kwargs.enable_thinking` wins);
- `stop` limits (≤ 1024 strings of 1..1024 characters, ≤ 32768 characters in all), `top_k`, and `n`/`best_of` > 1,
  which MindIE samples only with a temperature > 0 (OpenAI's default temperature 1 is sent when none was given);
- legacy `functions`/`function_call` are refused (MindIE has only `tools`); `/v1/completions` takes one prompt.
- a `req-id` header unique per upstream attempt (MindIE keys its requests on it).

Responses: `MindIESession` turns `fullTextEnabled` streams (every chunk carries the whole text so far) into true
deltas, checks them against the final chunk's `full_text`, and knows that a request with
`chat_template_kwargs.enable_thinking: false` does not start inside a `<think>` block. The fields MindIE adds
(`full_text`, `prefill_time`, `decode_time_arr`) are stripped as the mapping says (timings -> metrics). The rest of
MindIE's quirks (the repeated role, usage on the finish chunk, `tool_calls: []`, inline `<think>`) are ordinary
variations that the shared normalizer (proxy/hub/normalize.py) evens out for every dialect.

Errors: MindIE's `{"error": "<string>", "error_type": ...}` is parsed by the base class; here `Model not found`
becomes a 404 and the parameter a validation message names is put in `param`.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
from collections.abc import Mapping
from typing import Any, ClassVar, Final, cast
from urllib.parse import urlsplit

import orjson

from proxy.dialects.base import Dialect, RequestRules, UpstreamSession
from proxy.dialects.engine_metrics import EngineMetricNames
from proxy.dialects.error_shape import ErrorShape
from proxy.dialects.probing import Probe, ProbeListing
from proxy.dialects.templates import NameTest, interleaved_thinking, set_template_thinking, thinking_kwarg
from proxy.errors import ClientRequestError, ProxyError, StreamTruncated
from proxy.hub.canonical import CHAT, ChatChunk, ChatRequest, RequestContext
from proxy.hub.events import Timings
from proxy.hub.readings import Readings, number
from proxy.hub.structured import StructuredCaps
from proxy.stream.cumulative import CumulativeText, StreamForm

log: Final = logging.getLogger("dialect_proxy")

MAX_STOP_ITEMS: Final = 1024
MAX_STOP_LEN: Final = 1024
MAX_STOP_TOTAL: Final = 32768
MAX_INT32: Final = 2147483647

# The fresh part of a req-id: a random tag per process and a counter, unique per attempt without a system call
# (secrets.token_hex was a getrandom system call per request). Not secret: MindIE only
# needs its key unique; the tag keeps the workers and replicas of a gateway apart.
_REQ_TAG: Final = os.urandom(3).hex()
_req_counter: Final = itertools.count(1)

_MEDIA_PARTS: Final = ("image_url", "video_url", "audio_url")

# MindIE's "Model not found" (chat) and "Not found given model, please check modelName in config file." (completions)
_MODEL_NOT_FOUND: Final = re.compile(r"(?i)model not found|not found given model")
# MindIE validation messages name the parameter: "Parameter temperature must be in ...", "Parameter [n] should be ...",
# "Parameter 'repetition_penalty' must be ...", "length of `stop` must be ...", "Parameter top logprobs must be ...".
_PARAM_IN_MESSAGE: Final = re.compile(r"(?i)parameter\s+[\[\'`\"]?([a-z_]+(?: logprobs)?)|`([a-z_]+)`")
_KNOWN_PARAMS: Final = frozenset(
    {
        "model",
        "messages",
        "prompt",
        "stream",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "stop_token_ids",
        "n",
        "best_of",
        "max_tokens",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logprobs",
        "top_logprobs",
        "ignore_eos",
        "skip_special_tokens",
        "include_stop_str_in_output",
        "use_beam_search",
        "tools",
        "tool_choice",
        "enable_thinking",
        "chat_template_kwargs",
    }
)


# The models MindIE calls tools for, by its chat completion document ("tool_calls, tools and tool_choice support only
# some models ... ChatGLM3-6B, DeepSeek-R1, the Qwen2.5 series and the Qwen3 series"); with another model a request
# with tools may fail. Emulated structured output forces a tool call only for these (docs/mindie.md); for the others
# a client's own forced tool (pydantic-ai's output tool) is emulated too, asked and checked (docs/structured-output.md).
_TOOL_MODELS: Final = re.compile(r"(?i)chatglm3|deepseek[-_ ]?r1|qwen[-_ ]?2\.5|qwen[-_ ]?3")
calls_tools: Final = NameTest(_TOOL_MODELS)
_ASK_AND_CHECK: Final = StructuredCaps(forced_tool=False, calls_tools=False)


class MindIESession(UpstreamSession):
    """Per request: cumulative (`fullTextEnabled`) text -> true deltas, per choice; the thinking switch."""

    def __init__(self, dialect: Dialect, ctx: RequestContext) -> None:
        super().__init__(dialect, ctx)
        self._cumulative: dict[int, CumulativeText] | None = {} if ctx.stream and ctx.upstream.full_text else None
        self.rewrites = 0  # cumulative snapshots that revised text already sent
        self.full_text_mismatch = False  # what the client got differs from the upstream's final full_text
        # The first texts of a stream tell whether it is cumulative: one that does not match `full_text` ends with an
        # error (proxy/stream/cumulative.py StreamForm). While it watches, the text lane hands it every text.
        self._form: StreamForm | None = StreamForm() if ctx.stream else None
        self.rewrites_text = self._cumulative is not None or self._form is not None
        self.settling = self._form is not None  # texts may be held back until the form is known (`holds`)

    def build_request(self, body: ChatRequest) -> dict[str, Any]:
        out = super().build_request(body)
        kwargs = out.get("chat_template_kwargs")
        self.thinking_off = isinstance(kwargs, dict) and kwargs.get(thinking_kwarg(self.ctx.upstream_model)) is False
        return out

    def lane_text(self, index: int, text: str, reasoning: bool) -> str:
        """A cumulative snapshot -> its true delta, as `chunk` does for an event without a finish reason."""
        form = self._form
        if form is not None and index == 0 and not reasoning:
            self._watch(form, text)
        cumulative = self._cumulative
        if cumulative is None or reasoning or self.ctx.kind != CHAT:
            return text
        tracker = cumulative.get(index)
        if tracker is None:
            tracker = cumulative[index] = CumulativeText()
        return tracker.feed(text)

    def chunk(self, data: Any, whole: bool = False) -> ChatChunk | None:
        full_text = data.get("full_text") if isinstance(data, dict) else None  # rides on a choice's final chunk
        out = super().chunk(data, whole)
        self.extras.pop("full_text", None)  # a check, not a metric
        if out is None:
            return None
        key = "content" if self.ctx.kind == CHAT else "text"
        form = self._form
        if form is not None:
            first = self._first_text(out, key)
            if first is not None:
                self._watch(form, first)
            if full_text is None and self._short_deltas(out):
                raise self._mismatch("deltas")
        cumulative = self._cumulative
        if cumulative is None:
            if full_text is not None and self.ctx.stream:  # the upstream's own word: its text was cumulative
                raise self._mismatch("cumulative")
            return out
        for choice in out.get("choices") or ():
            self._to_delta(cumulative, choice, key, full_text if isinstance(full_text, str) else None)
        return out

    def _part(self, choice: dict[str, Any]) -> Any:
        """Where a choice's text is: its delta (chat) or the choice itself (completions)."""
        return choice.get("delta") if self.ctx.kind == CHAT else choice

    def _first_text(self, out: ChatChunk, key: str) -> str | None:
        """The text of choice 0 in this chunk (the one the stream's form is told by), if it has one."""
        for choice in out.get("choices") or ():
            part = self._part(choice)
            if (choice.get("index") or 0) == 0 and isinstance(part, dict) and isinstance(part.get(key), str):
                return str(part[key])
        return None

    def _short_deltas(self, out: ChatChunk) -> bool:
        """With `full_text`, choice 0 of a chat stream finishes before its form is settled, after a text that did not
        extend the one before, and without MindIE's final `full_text` (which full-text mode sends on that chunk): a
        short delta stream, whose held text must not go out."""
        form = self._form
        if form is None or not form.doubted or self._cumulative is None or self.ctx.kind != CHAT:
            return False
        return any((c.get("index") or 0) == 0 and c.get("finish_reason") is not None for c in out.get("choices") or ())

    def _to_delta(self, cumulative: dict[int, CumulativeText], choice: dict[str, Any], key: str,
                  full_text: str | None) -> None:
        """One choice's cumulative snapshot -> its true delta; at its finish, checked against `full_text`."""
        index = choice.get("index") or 0
        text = cumulative.get(index)
        if text is None:
            text = cumulative[index] = CumulativeText()
        part = self._part(choice)
        if not isinstance(part, dict):
            return
        snapshot = part.get(key)
        delta = text.feed(snapshot) if snapshot else ""
        if choice.get("finish_reason") is not None:
            delta += text.flush(full_text)
            self.rewrites += text.rewrites
            if text.mismatch:
                self.full_text_mismatch = True
                log.warning(
                    "upstream %s: streamed text differs from its final full_text (%d rewrites); the "
                    "client keeps what it was sent",
                    self.ctx.upstream.name,
                    text.rewrites,
                )
        if snapshot is not None or delta:
            part[key] = delta

    def holds(self) -> bool:
        """Without `full_text` every text waits for the verdict: a cumulative stream read as deltas repeats its text,
        and no byte of it may reach the client. With `full_text` a text waits only once one has not extended the one
        before: until then each text is right under the configured form (the first is the same text in either form,
        and an extending snapshot adds exactly its new part), and a delta stream found later ends in an in-stream
        error (docs/decisions.md "The stream's form: what waits for it")."""
        form = self._form
        return form is not None and form.started and (self._cumulative is None or form.doubted)

    def _watch(self, form: StreamForm, text: str) -> None:
        verdict = form.feed(text)
        if not form.open:
            self._form = None
            self.rewrites_text = self._cumulative is not None
            self.settling = False
        if verdict:
            if (verdict == "cumulative") != (self._cumulative is not None):
                raise self._mismatch(verdict)
            self.dialect.finding = None  # this stream's form is the configured one: an earlier mismatch is over

    def _mismatch(self, form: str) -> StreamTruncated:
        return cast("MindIEDialect", self.dialect).stream_form_mismatch(self.ctx, form)


class MindIEErrors(ErrorShape):
    """`Model not found` becomes a 404; the parameter a validation message names goes into `param`."""

    def from_body(self, status: int, raw: bytes, headers: dict[str, str] | None = None) -> ProxyError:
        err = super().from_body(status, raw, headers)
        err.upstream_code = str(status)  # a bounded metrics label ("422"), not MindIE's free-text error_type
        if not raw.strip() and status == 503:
            err.message += " MindIE answers so while it starts up, or when it is overloaded or unhealthy."
        if status in (400, 404, 422) and _MODEL_NOT_FOUND.search(err.message):
            err.status, err.type, err.code, err.param = 404, "not_found_error", "model_not_found", "model"
        elif err.status == 404:
            err.code = "not_found"
        elif err.status == 400 and err.param is None:
            err.param = _param_in(err.message)
        return err


class MindIEProbe(Probe):
    def error_shape(self, data: dict[str, Any]) -> bool:
        return isinstance(data.get("error"), str)  # {"error": "...", "error_type": "..."}

    def listing(self, listing: ProbeListing) -> str | None:
        if "MindIE Server" in listing.owners or (listing.error and self.shaped(listing.body)):
            return "MindIE-shaped model list" if listing.listed else "MindIE error shape"
        return None

    def config_notes(self, url: str) -> list[str]:
        parts = urlsplit(url)
        return [f"    # health_url: {parts.scheme}://{parts.hostname}:1026/health   # MindIE's health is on its "
                "management port (managementPort, default 1026): set it so that /readyz asks it too"]


class MindIEDialect(Dialect):
    name = "mindie"
    session_class = MindIESession
    errors_class = MindIEErrors
    probe = MindIEProbe(structured_output=True)
    # MindIE does not read stream_options; usage rides on its finish chunk anyway.
    # Structured output came with MindIE 2.3; earlier servers ignore response_format (docs/mindie.md): it is
    # emulated by a forced call of a tool (the models MindIE calls tools for: docs/structured-output.md).
    rules = RequestRules(stream_usage_option=False, response_format="emulate", response_format_hint=(
        "MindIE 2.3 and later honour it: set `response_format: pass` for this upstream."))
    full_text_mode = True
    # MindIE's own load, on its metrics port (metricsPort, served with MIES_SERVICE_MONITOR_MODE=1; refreshed once a
    # second): unprefixed gauges labelled model_name, the NPU KV cache's use as a 0..1 fraction, as vLLM's
    # vllm:kv_cache_usage_perc is (docs/inference-gateway.md).
    engine_metrics = EngineMetricNames(waiting="num_requests_waiting", running="num_requests_running",
                                       kv_cache="npu_cache_usage_perc")
    # Ready once the model is loaded (its management port's /health says the same: health_url).
    ready_path = "/v2/health/ready"
    # top_k: MindIE takes -1 (off) or (0, 2^31-1]; Siliconstorm documents [0, 2^31-1].
    top_k_zero_ok: ClassVar[bool] = False
    # Whether tools are called only for the models of MindIE's list (`calls_tools`); Siliconstorm's document names no
    # such limit.
    tools_for_listed_models: ClassVar[bool] = True

    def structured_caps(self, body: ChatRequest, ctx: RequestContext) -> StructuredCaps:
        """A forced tool call for the models MindIE calls tools for; the others are asked and checked."""
        if self.tools_for_listed_models and not calls_tools(ctx.upstream_model):
            return _ASK_AND_CHECK
        return self.rules.structured

    def stream_form_mismatch(self, ctx: RequestContext, form: str) -> StreamTruncated:
        """The stream turned out `form` ("cumulative" or "deltas") against the upstream's `full_text`: the error that
        ends it, kept as this upstream's finding (/readyz reports it until a stream of the configured form ends it) and
        logged when the finding begins."""
        name = ctx.upstream.name
        if form == "cumulative":
            text = (f"The upstream `{name}` streams cumulative text (each chunk repeats the text so far: MindIE "
                    "fullTextEnabled) but is configured without `full_text: true`, so the answer would repeat "
                    "itself. Set `full_text: true` for it (--full-text), or fullTextEnabled: false in MindIE's "
                    "config.json.")
        else:
            text = (f"The upstream `{name}` streams true deltas but is configured with `full_text: true`, so the "
                    "answer would lose text. Set `full_text: false` for it, or fullTextEnabled: true in MindIE's "
                    "config.json.")
        if self.finding is None:
            log.warning(orjson.dumps({"event": "stream_form_mismatch", "upstream": name,
                                      "full_text": ctx.upstream.full_text, "stream": form, "detail": text}).decode())
        self.finding = "stream requests fail (non-stream requests work): " + text
        # The same answer every time until the config changes: no client should retry it.
        return StreamTruncated(text, reason="full_text_mismatch", status=502, code="full_text_mismatch",
                               upstream_code="full_text_mismatch", headers={"x-should-retry": "false"})

    def timings(self, extras: Mapping[str, Any]) -> Timings | None:
        """`prefill_time` (ms) and `decode_time_arr` (ms per token) at the top level, `queue_wait_time` (µs per token)
        and `batch_size` (per token) in `usage` (either place is accepted for each). The lists are passed on unread,
        with their units (proxy/hub/readings.py: values that are not finite non-negative numbers are left out there)."""
        nested = extras.get("usage")
        nested = nested if isinstance(nested, dict) else _EMPTY  # JSON's; an ABC's isinstance runs Python code
        prefill = number(_field(extras, nested, "prefill_time"))
        decode = _list(_field(extras, nested, "decode_time_arr"), DECODE_TIME_UNIT)
        queue = _list(_field(extras, nested, "queue_wait_time"), QUEUE_WAIT_TIME_UNIT)
        batch = _list(_field(extras, nested, "batch_size"), 1.0)
        if prefill is None and decode is None and queue is None and batch is None:
            return None
        return Timings(None if prefill is None else prefill * PREFILL_TIME_UNIT, decode, queue, batch)

    def reasoning_replay(self, body: ChatRequest, ctx: RequestContext) -> str:
        """`auto`: R1-era models strip; thinking models whose templates render the tool loop's reasoning restore it
        (a turn never seen stays without: the template's own "no reasoning" form); others keep."""
        mode = super().reasoning_replay(body, ctx)
        interleaved = interleaved_thinking(ctx.upstream_model)
        if ctx.upstream.reasoning_replay == "auto" and mode == "keep" and interleaved:
            return "restore"
        return mode

    # -- requests ---------------------------------------------------------------------------------------------
    def build_request(self, body: ChatRequest, ctx: RequestContext) -> dict[str, Any]:
        body = dict(body)
        _refuse(body, "functions", "MindIE supports `tools`, not the legacy `functions`; send `tools` instead.")
        _refuse(
            body,
            "function_call",
            "MindIE supports `tool_choice`, not the legacy `function_call`; send `tool_choice` instead.",
        )
        if ctx.kind == CHAT:
            body["messages"] = _messages(body.get("messages"))
        else:
            _completion_prompt(body)
        set_template_thinking(body, ctx.upstream_model)
        out = super().build_request(body, ctx)
        _check_stop(out)
        self._check_top_k(out)
        _check_samples(out)
        return out

    def request_headers(self, ctx: RequestContext) -> dict[str, str]:
        headers = super().request_headers(ctx)
        # MindIE uses req-id as its own request key: two attempts (or two clients reusing an x-request-id) must not
        # collide, so each attempt gets the request id plus a fresh suffix (docs/decisions.md
        # "Model names and ids in answers").
        headers["req-id"] = f"{ctx.request_id}-{ctx.attempt}{_REQ_TAG}{next(_req_counter)}"
        return headers

    def _check_top_k(self, out: dict[str, Any]) -> None:
        top_k = out.get("top_k")
        if top_k is None:
            return
        lowest = 0 if self.top_k_zero_ok else 1
        if not (top_k == -1 or lowest <= top_k <= MAX_INT32):
            span = f"[0, {MAX_INT32}]" if self.top_k_zero_ok else f"-1 or [1, {MAX_INT32}]"
            raise ClientRequestError(f"`top_k` = {top_k} is outside {span} accepted by this upstream.", param="top_k")


# ------------------------------------------------------------------------------------------------------ helpers


def _param_in(message: str) -> str | None:
    for match in _PARAM_IN_MESSAGE.finditer(message):
        name = (match.group(1) or match.group(2)).lower().replace(" ", "_")
        if name in _KNOWN_PARAMS:
            return name
    return None


def _refuse(body: dict[str, Any], key: str, message: str) -> None:
    if body.get(key) is not None:
        raise ClientRequestError(f"`{key}`: {message}", param=key)


def _messages(messages: Any) -> Any:
    """A copy of `messages` in the shapes MindIE accepts (only what differs is copied)."""
    if not isinstance(messages, list):
        return messages
    out = []
    for message in messages:
        if not isinstance(message, dict):
            out.append(message)
            continue
        new = message
        if message.get("role") == "developer":
            new = {**message, "role": "system"}
        content = message.get("content")
        if isinstance(content, list) and any(_content_part(p) is not p for p in content):
            if new is message:
                new = dict(message)
            new["content"] = [_content_part(p) for p in content]
        out.append(new)
    return out


def _content_part(part: Any) -> Any:
    """OpenAI `{"type": "image_url", "image_url": {"url": U, "detail": ...}}` -> MindIE `{"type": ..., "image_url": U}`
    (`detail` has no MindIE equivalent)."""
    if not isinstance(part, dict):
        return part
    kind = part.get("type")
    if kind in _MEDIA_PARTS and isinstance(part.get(kind), dict):
        url = part[kind].get("url")
        if isinstance(url, str):
            return {**part, kind: url}
    return part


def _completion_prompt(body: dict[str, Any]) -> None:
    """MindIE's /v1/completions takes one prompt: a string or a list of token ids."""
    prompt = body.get("prompt")
    # A batch: strings, or lists of token ids. One of them is the prompt itself.
    if (
        isinstance(prompt, list)
        and prompt
        and (all(isinstance(p, str) for p in prompt) or all(isinstance(p, list) for p in prompt))
    ):
        if len(prompt) > 1:
            raise ClientRequestError(
                f"`prompt`: MindIE completes one prompt per request; got a batch of {len(prompt)} prompts.",
                param="prompt",
            )
        body["prompt"] = prompt[0]
    if body.get("echo") is True:
        raise ClientRequestError("`echo`: MindIE cannot echo the prompt back.", param="echo")
    if body.get("suffix"):
        raise ClientRequestError("`suffix`: MindIE has no fill-in-the-middle completions.", param="suffix")
    body.pop("echo", None)
    body.pop("suffix", None)


def _check_stop(out: dict[str, Any]) -> None:
    stop = out.get("stop")
    if stop is None:
        return
    if isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list):
        if not stop:
            del out["stop"]  # MindIE: an empty list means null
            return
        stops = stop
    else:
        raise ClientRequestError(f"`stop` must be a string or a list of strings, got {stop!r}.", param="stop")
    total = 0
    for s in stops:
        if not isinstance(s, str) or not 1 <= len(s) <= MAX_STOP_LEN:
            raise ClientRequestError(
                f"`stop`: each stop sequence must be a string of 1 to {MAX_STOP_LEN} characters; got {s!r:.60}.",
                param="stop",
            )
        total += len(s)
    if total > MAX_STOP_TOTAL:
        raise ClientRequestError(
            f"`stop`: the stop sequences have {total} characters in all; this upstream accepts at most "
            f"{MAX_STOP_TOTAL}.",
            param="stop",
        )


def _check_samples(out: dict[str, Any]) -> None:
    """MindIE samples n > 1 (or best_of > 1) sequences only with temperature > 0. OpenAI's default temperature is 1,
    so when the client gave none we send 1; an explicit 0 is refused rather than silently changed."""
    count = max(out.get("n") or 1, out.get("best_of") or 1)
    if count <= 1:
        return
    temperature = out.get("temperature")
    if temperature is None:
        out["temperature"] = 1.0
    elif temperature == 0:
        key = "n" if (out.get("n") or 1) > 1 else "best_of"
        raise ClientRequestError(
            f"`{key}` = {count} needs a temperature > 0 on this upstream (MindIE does not sample several "
            "answers greedily); raise `temperature` or ask for one answer.",
            param=key,
        )


# Units of MindIE's timing fields. queue_wait_time is documented in microseconds (mindie-chat-completions.md, usage
# table). prefill_time and decode_time_arr have no documented unit; the documented examples (prefill 39..200,
# decode ~27 per token) only make sense as milliseconds, which is also what MindIE's own benchmarks print.
PREFILL_TIME_UNIT: Final = 1e-3
DECODE_TIME_UNIT: Final = 1e-3
QUEUE_WAIT_TIME_UNIT: Final = 1e-6
_EMPTY: Final[dict[str, Any]] = {}  # (never written)


def _field(extras: Mapping[str, Any], nested: dict[str, Any], key: str) -> Any:
    value = extras.get(key)
    return nested.get(key) if value is None else value


def _list(value: object, unit: float) -> Readings | None:
    return Readings(value, unit) if isinstance(value, list) else None

