"""`dialect-proxy probe URL`: what an upstream is, found out the way the proxy would talk to it.

A handful of tiny requests, each bounded in time and size, with aiohttp directly (nothing of the proxy's request
path, so a probe works even where that path has a bug):

1. `GET /v1/models` (and `GET /models`): is it reachable, does it need TLS / a client certificate / a CA file / an
   API key, which paths answer, in which error shape, which models it serves;
2. only when neither answered: the info paths where the servers of some dialects describe themselves (a mapping's
   `info` path: a server that runs one model names it there, and its kind), then the chat paths of the dialects
   without a model listing;
3. where the dialect serves chat, one small streamed chat request: cumulative text (MindIE `fullTextEnabled`),
   reasoning as a field, as `<think>` tags or as R1's lone `</think>`, where usage comes;
4. one small streamed request with a tool and `tool_choice: required`: are tool calls streamed, with `index`?
5. where the dialect asks for it: one small `response_format` json_schema request: is structured output honoured
   (MindIE 2.3 and later), so the config block says `response_format: pass`?

What is dialect-specific — how each dialect's servers are recognised, what its chat body carries, what its config
block notes — each spoke declares (its `Dialect.probe`, a proxy/dialects/probing.py `Probe`); this module runs those
steps for every spoke in the registry.

The result is a `Report`: a short table for people, one JSON object for scripts (`--json`), and the config block
to paste into the proxy's YAML file.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import orjson
import yaml

from proxy.dialects import DIALECTS, family
from proxy.dialects.base import Dialect
from proxy.dialects.mapping import load_mapping
from proxy.dialects.probing import ProbeInfo, ProbeListing
from proxy.dialects.templates import THINKING_MODEL_RE
from proxy.gateway.upstream import connection_hint
from proxy.hub.sse import SSEDecoder

# docs/decisions.md "Reasoning": these upstream names start inside the thinking block.
R1_NAME = THINKING_MODEL_RE
_BODY_LIMIT = 2**20
_MAX_EVENTS = 2000
_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
           "additionalProperties": False}
TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@dataclass
class ProbeOptions:
    url: str
    dialect: str | None = None
    api_key: str | None = None
    api_key_env: str | None = None  # only its name goes into the config block
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_verify: bool = True
    timeout: float = 10.0
    model: str | None = None
    prompt: str = "Say hello in five words."
    max_tokens: int = 48


@dataclass
class Report:
    url: str
    reachable: bool = False
    tls: str = "none"            # none | tls | mutual_tls
    dialect: str | None = None
    dialect_evidence: list[str] = field(default_factory=list)
    # What the server answered as when that is not the dialect given with --dialect (a warning in the table and in
    # the config block); None: it agrees, or nothing was recognised.
    answers_as: str | None = None
    paths: dict[str, int] = field(default_factory=dict)          # "GET /v1/models" -> HTTP status
    error_shapes: dict[str, str] = field(default_factory=dict)   # "GET /models" -> openai | mindie | siliconstorm...
    # What was not found out is None ("unknown" in the table, null in JSON), never a default that looks like an answer.
    api_key_required: bool | None = None
    models: list[str] = field(default_factory=list)
    # The kinds of model the server said it serves on its dialect's info path (chat, embeddings, rerank); None: not
    # learnt that way.
    kinds: list[str] | None = None
    model_used: str | None = None
    full_text: bool | None = None
    reasoning: str | None = None   # field | tags | close_only | none
    usage: str | None = None       # final_chunk | finish_chunk | every_chunk | none
    tool_calls: str | None = None  # streamed | streamed_without_index | one_piece | not_called | refused | failed
    # MindIE / Siliconstorm only (elsewhere the dialect's default is right): honoured | ignored | refused | untested
    response_format: str = "untested"
    chat: str = "untested"       # ok | HTTP <status>: <message> | ...
    problems: list[dict[str, str]] = field(default_factory=list)  # {"problem", "hint"}
    requests: int = 0
    config: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def problem(self, problem: str, hint: str = "") -> None:
        self.problems.append({"problem": problem, "hint": hint})

    def worked(self) -> bool:
        """The server was recognised and did what its dialect's servers do: a chat request worked, or (a dialect
        without chat) it described itself on its info path; nothing is wrong."""
        checked = self.chat == "ok" or self.kinds is not None and self.dialect is not None and not _chats(self.dialect)
        return self.reachable and self.dialect is not None and checked and not self.problems

    def render(self) -> str:
        rows = [
            ("upstream", self.url),
            ("reachable", "yes" if self.reachable else "no"),
            ("tls", self.tls),
            ("dialect", f"{self.dialect or 'unknown'}" + (f"  ({'; '.join(self.dialect_evidence)})"
                                                         if self.dialect_evidence else "")),
            ("paths", ", ".join(f"{k} -> {v}" for k, v in self.paths.items()) or "-"),
            ("error shapes", ", ".join(f"{k}: {v}" for k, v in self.error_shapes.items()) or "-"),
            ("api key", _unknown(self.api_key_required, "required", "not required (or accepted)")),
            ("models", ", ".join(self.models) or "- (no model listing)"),
            *([("kinds", ", ".join(self.kinds) or "none the proxy serves")] if self.kinds is not None else []),
            ("chat request", f"{self.chat}" + (f" (model {self.model_used})" if self.model_used else "")),
            ("full text", _unknown(self.full_text, "yes (cumulative stream text: full_text: true)", "no")),
            ("reasoning", self.reasoning or "unknown"),
            ("usage", self.usage or "unknown"),
            ("tool calls", self.tool_calls or "unknown"),
            ("response_format", self.response_format),
        ]
        width = max(len(k) for k, _ in rows)
        lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
        for p in self.problems:
            lines.append(f"problem: {p['problem']}" + (f"\n  fix: {p['hint']}" if p["hint"] else ""))
        if self.config:
            lines += ["", f"config block ({self.requests} requests sent):", self.config.rstrip()]
        else:
            lines += ["", f"no config block ({self.requests} requests sent): the dialect is unknown until the "
                          "problems above are fixed"]
        return "\n".join(lines)


def _unknown(value: bool | None, yes: str, no: str) -> str:
    return "unknown" if value is None else yes if value else no


class _Failed(Exception):
    """A request that got no HTTP answer."""

    def __init__(self, exc: BaseException, problem: str) -> None:
        super().__init__(problem)
        self.exc = exc
        self.problem = problem


@dataclass
class _Answer:
    status: int
    content_type: str
    body: bytes


def ssl_context(opts: ProbeOptions, verify: bool | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=opts.tls_ca_file)
    if opts.tls_cert_file and opts.tls_key_file:
        ctx.load_cert_chain(opts.tls_cert_file, opts.tls_key_file)
    if not (opts.tls_verify if verify is None else verify):
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def base_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url[:-3] if url.endswith("/v1") else url


class Prober:
    def __init__(self, opts: ProbeOptions) -> None:
        self.opts = opts
        self.base = base_url(opts.url)
        self.report = Report(url=self.base)
        self._session: aiohttp.ClientSession | None = None
        self._first: tuple[str, _Answer] = ("", _Answer(0, "", b""))
        self._chat_events: list[dict[str, Any]] | None = None  # a streamed answer detection already read
        self._info: ProbeInfo | None = None  # what the server said of itself on its dialect's info path
        self._untrusted = False

    # -- plumbing -------------------------------------------------------------------------------------------------
    def _open_session(self, verify: bool | None = None) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(ssl=ssl_context(self.opts, verify), limit=4)
        return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=self.opts.timeout), skip_auto_headers=("User-Agent",))

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "User-Agent": "dialect-proxy-probe"}
        if self.opts.api_key:
            headers["Authorization"] = f"Bearer {self.opts.api_key}"
        return headers

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None, *,
                       base: str | None = None, session: aiohttp.ClientSession | None = None,
                       stream: bool = False) -> tuple[_Answer, list[dict[str, Any]] | None]:
        """One request, bounded by opts.timeout in all. Returns the answer and, for an event stream, its events."""
        session = session or self._session
        assert session is not None
        url = (base or self.base) + path
        self.report.requests += 1
        try:
            async with asyncio.timeout(self.opts.timeout):
                data = orjson.dumps(body) if body is not None else None
                async with session.request(method, url, data=data, headers=self._headers(),
                                           allow_redirects=False) as resp:
                    ctype = resp.headers.get("Content-Type", "")
                    if stream and resp.status == 200 and ctype.startswith("text/event-stream"):
                        events = await _read_events(resp)
                        return _Answer(resp.status, ctype, b""), events
                    raw = await resp.content.read(_BODY_LIMIT)
                    return _Answer(resp.status, ctype, raw), None
        except TimeoutError as e:
            raise _Failed(e, f"no answer within {self.opts.timeout:g} s") from None
        except aiohttp.ClientError as e:
            hint = connection_hint(url, e, bool(self.opts.tls_cert_file))
            raise _Failed(e, _reason(e) + (f" — {hint}" if hint else "")) from None

    def _record(self, label: str, answer: _Answer) -> None:
        self.report.paths[label] = answer.status
        shape = _error_shape(answer.body)
        owner = DIALECTS.get(shape)
        if answer.status >= 400 or owner is not None and owner.probe.error_at_200:
            self.report.error_shapes[label] = shape
        if answer.status in (401, 403) or owner is not None and owner.probe.refused_key(answer.body):
            self.report.api_key_required = True
        elif 200 <= answer.status < 300 and self.report.api_key_required is None and label.startswith("GET"):
            self.report.api_key_required = False

    # -- the probe ------------------------------------------------------------------------------------------------
    async def run(self) -> Report:
        r = self.report
        r.tls = "none" if self.base.startswith("http://") else (
            "mutual_tls" if self.opts.tls_cert_file else "tls")
        try:
            async with self._open_session() as self._session:
                if not await self._connect():
                    if not self._untrusted:
                        return self._finish()
                    # Only the CA is missing: learn the rest without verification (the problem stays reported).
                    async with self._open_session(verify=False) as self._session:
                        if not await self._connect():
                            return self._finish()
                        await self._rest()
                    return self._finish()
                await self._rest()
        finally:
            self._session = None
        return self._finish()

    async def _rest(self) -> None:
        r = self.report
        r.reachable = True
        await self._detect()
        if r.dialect is not None and not _chats(r.dialect):
            self._no_chat(r.dialect)
        elif r.dialect is not None:
            await self._chat()
            if r.chat == "ok":
                await self._tools()
                if DIALECTS[r.dialect].probe.structured_output:
                    await self._structured()

    async def _connect(self) -> bool:
        """The first request: on a connection failure, find out what is wrong with the TLS settings. It is the generic
        model listing whatever --dialect says: detection reads it either way (a server of another dialect than the
        one given must still be recognised)."""
        path = "/v1/models"
        try:
            answer, _ = await self._request("GET", path)
        except _Failed as f:
            await self._diagnose(f)
            return False
        self._first = (path, answer)
        return True

    async def _diagnose(self, f: _Failed) -> None:
        r = self.report
        exc = f.exc
        if isinstance(exc, aiohttp.ClientConnectorCertificateError):
            r.tls = "mutual_tls" if self.opts.tls_cert_file else "tls"
            self._untrusted = True
            r.problem(f"the server's TLS certificate is not trusted ({_reason(exc)})",
                      "set tls_ca_file (probe: --tls-ca-file) to the CA that signed it; tls_verify: false only "
                      "for testing")
        elif isinstance(exc, aiohttp.ClientConnectorSSLError) and self.base.startswith("https://"):
            r.tls = "none"
            r.problem(f"the port does not speak TLS ({_reason(exc)})", "use an http:// URL")
        elif self.base.startswith("http://") and _reset(exc):
            https = "https://" + self.base[len("http://"):]
            try:
                async with self._open_session(verify=False) as s:
                    await self._request("GET", "/v1/models", base=https, session=s)
                speaks_tls = True
            except _Failed as again:
                speaks_tls = not isinstance(again.exc, aiohttp.ClientConnectorSSLError | aiohttp.ClientConnectorError)
            if speaks_tls:
                r.tls = "tls"
                r.problem("plain HTTP to a port that speaks TLS (MindIE httpsEnabled: true)",
                          f"use an https:// URL ({https}), with tls_ca_file, and tls_cert_file/tls_key_file for "
                          "MindIE's mutual TLS")
            else:
                r.problem(f"not reachable: {f.problem}",
                          "check the host and port (and that the server runs and listens there)")
        elif self.base.startswith("https://") and not self.opts.tls_cert_file and _reset(exc):
            r.tls = "mutual_tls"
            r.problem("the server closed the TLS connection: it needs a client certificate (mutual TLS, MindIE "
                      "httpsEnabled)", "set tls_cert_file and tls_key_file (probe: --tls-cert-file/--tls-key-file)")
        else:
            r.problem(f"not reachable: {f.problem}",
                      "check the host and port (and that the server runs and listens there)")

    async def _detect(self) -> None:
        """Which dialect the server answers as. A 404's body is no evidence (an engine API answers every OpenAI path
        with an OpenAI-shaped 404): before a verdict without a model listing, every dialect's chat path is tried.
        With --dialect, the server is still asked, and a different answer is a problem (a non-zero exit)."""
        listing = await self._listing()
        found: str | None = None
        evidence = ""
        for spoke in _detection_order():
            recognised = spoke.probe.listing(listing)
            if recognised is not None:
                found, evidence = spoke.name, recognised
                break
        else:
            found, evidence = await self._try_info_paths()
            if found is None:
                found, evidence = await self._try_chat_paths()
        self._auth_problem(self._first[1])
        self._verdict(found, evidence)

    async def _listing(self) -> ProbeListing:
        """What the model-listing paths say: the first answer (`GET /v1/models`), then `GET /models`. The models are
        those of the first that lists any."""
        r = self.report
        path, first = self._first
        self._record(f"GET {path}", first)
        listed = _model_cards(first.body) if first.status == 200 else None
        plain = None
        try:
            plain, _ = await self._request("GET", "/models")
            self._record("GET /models", plain)
        except _Failed as f:
            r.problem(f"GET /models: {f.problem}", "check the URL (host, port, path prefix)")
        plain_cards = _model_cards(plain.body) if plain is not None and plain.status == 200 else None
        r.models = [c["id"] for c in (listed if listed is not None else plain_cards or ())]
        return ProbeListing(
            first.status, _json(first.body), first.status >= 400 and first.status not in (404, 405),
            {str(c.get("owned_by")) for c in listed or ()}, listed is not None, plain_cards is not None)

    def _verdict(self, found: str | None, evidence: str) -> None:
        """The report's dialect: the one given with --dialect (a server that answers as another family is a problem),
        else the one found."""
        r = self.report
        given = self.opts.dialect
        if given:
            r.dialect = given
            r.dialect_evidence.append("given with --dialect")
            if found is not None and family(found) != family(given):
                r.answers_as = found
                r.problem(f"the server answers as the {found} dialect ({evidence}), not {given} (--dialect)",
                          f"use dialect: {found} (probe: --dialect {found}, or leave --dialect out)")
        elif found is not None:
            r.dialect = found
            r.dialect_evidence.append(evidence)
        else:
            r.problem("no dialect recognised: no model listing at /v1/models or /models, and no chat path "
                      "(/chat, /v1/chat/completions) that takes requests",
                      "check the URL (host, port, path prefix) or give --dialect")

    async def _try_info_paths(self) -> tuple[str | None, str]:
        """Without a model listing: the paths where the servers of some dialects describe themselves (a mapping's
        `info` path), each asked once; the first spoke whose `Probe.info` reads its answer as its own is the one."""
        answers: dict[str, _Answer | None] = {}
        for spoke in _detection_order():
            path = load_mapping(spoke.name).paths.get("info")
            if not path:
                continue
            if path not in answers:
                answers[path] = await self._get_info(path)
            answer = answers[path]
            info = spoke.probe.info(_json(answer.body)) if answer is not None and answer.status == 200 else None
            if info is not None:
                self._info = info
                self.report.models = list(info.models)
                self.report.kinds = list(info.kinds)
                return spoke.name, info.evidence
        return None, ""

    async def _get_info(self, path: str) -> _Answer | None:
        try:
            answer, _ = await self._request("GET", path)
        except _Failed as f:
            self.report.problem(f"GET {path}: {f.problem}", "check the URL (host, port, path prefix)")
            return None
        self._record(f"GET {path}", answer)
        return answer

    def _no_chat(self, dialect: str) -> None:
        """A dialect that serves no chat: what its info path said is all there is to learn (no chat request)."""
        r = self.report
        if self._info is None:
            if r.answers_as is None:  # (a server of another dialect is a problem already)
                r.problem(f"the server did not describe itself as a {dialect} server does "
                          f"(GET {load_mapping(dialect).paths.get('info') or '-'})",
                          "check the URL (host, port, path prefix) and the dialect")
        elif not self._info.kinds:
            served = [kind for kind in ("embeddings", "rerank") if load_mapping(dialect).paths.get(kind)]
            r.problem(f"the server's model is of no kind the proxy serves ({self._info.evidence})",
                      f"point this upstream at a server of a model for {' or '.join(served) or 'chat'}")

    async def _try_chat_paths(self) -> tuple[str | None, str]:
        """Without a model listing: the chat paths of the dialects recognised there — a small streamed request
        (`Probe.chat_path = "stream"`), then a body invalid on purpose (`"invalid"`: its validation error proves the
        path; nothing is generated)."""
        for spoke in _detection_order():
            evidence: str | None
            if spoke.probe.chat_path == "stream":
                evidence = await self._try_streamed_chat(spoke)
            elif spoke.probe.chat_path == "invalid":
                evidence = await self._try_invalid_chat(spoke)
                if evidence is None:
                    return None, ""
            else:
                continue
            if evidence:
                return spoke.name, evidence
        return None, ""

    async def _try_invalid_chat(self, spoke: type[Dialect]) -> str | None:
        """The evidence ("" if none), or None when the path could not be asked at all."""
        path = _chat_path(spoke.name)
        try:
            answer, _ = await self._request("POST", path, {"model": self._model(),
                                                           "messages": "an invalid body on purpose"})
        except _Failed as f:
            self.report.problem(f"POST {path}: {f.problem}", "check the URL (host, port, path prefix)")
            return None
        self._record(f"POST {path}", answer)
        if answer.status in (400, 422) and _error_shape(answer.body) == _generic().name:
            return f"POST {path} validates requests (no model listing)"
        return ""

    def _auth_problem(self, answer: _Answer) -> None:
        if self.report.api_key_required:
            given = "the API key given was refused" if self.opts.api_key else "it needs an API key"
            self.report.problem(f"{given} (HTTP {answer.status})",
                                "put the key in an environment variable and name it in api_key_env "
                                "(probe: --api-key-env)")

    async def _try_streamed_chat(self, spoke: type[Dialect]) -> str:
        path = _chat_path(spoke.name)
        try:
            answer, events = await self._request("POST", path, self._chat_body(spoke.name), stream=True)
        except _Failed as f:
            self.report.problem(f"POST {path}: {f.problem}")
            return ""
        self._record(f"POST {path}", answer)
        if events is not None:
            self._chat_events = events
            return f"POST {path} streams completions; no model listing"
        if answer.status in (400, 422) and _error_shape(answer.body) == _generic().name:
            return f"POST {path} answers with OpenAI-shaped validation errors"
        return ""

    def _chat_body(self, dialect: str, tools: bool = False) -> dict[str, Any]:
        spoke = DIALECTS[dialect]
        body: dict[str, Any] = {"messages": [{"role": "user", "content": self.opts.prompt}], "stream": True,
                                "max_tokens": self.opts.max_tokens}
        if spoke.probe.sends_model:
            body["model"] = self._model()
        if spoke.rules.stream_usage_option:  # (MindIE does not read stream_options; it sends usage on its finish chunk)
            body["stream_options"] = {"include_usage": True}
        if tools:
            body["tools"] = [TOOL]
            body["tool_choice"] = "required"
        spoke.probe.chat_body(body, tools)
        if tools:
            body["messages"] = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
        return body

    def _model(self) -> str:
        return self.opts.model or (self.report.models[0] if self.report.models else "default")

    async def _chat(self) -> None:
        r = self.report
        dialect = r.dialect
        assert dialect is not None
        path = _chat_path(dialect)
        events = self._chat_events
        if events is None:
            try:
                answer, events = await self._request("POST", path, self._chat_body(dialect), stream=True)
            except _Failed as f:
                r.chat = f"failed: {f.problem}"
                return
            self._record(f"POST {path}", answer)
            if events is None:
                r.chat = f"HTTP {answer.status}: {_message(answer.body)}"
                if answer.status in (401, 403):
                    hint = "check the API key (--api-key-env)"
                elif answer.status == 404:
                    hint = (f"POST {path} does not exist there: check the URL's path prefix and the dialect, or the "
                            "model name (--model)")
                elif answer.status in (400, 422):
                    hint = "check the model name (--model) and --max-tokens against the server's limits"
                else:
                    hint = "the server failed the request: see its message (and its logs); retry when it is up"
                r.problem(f"the streamed chat request failed: {r.chat}", hint)
                return
        r.model_used = self._model() if DIALECTS[dialect].probe.sends_model else None
        r.chat = "ok"
        _analyse(r, events, r.model_used or "")
        if not self.opts.dialect and family(dialect) == dialect:
            for spoke in DIALECTS.values():
                if spoke.name != dialect and family(spoke.name) == dialect:
                    evidence = spoke.probe.after_chat(events, r.usage != "none")
                    if evidence is not None:
                        r.dialect = spoke.name
                        r.dialect_evidence.append(evidence)
                        break

    async def _tools(self) -> None:
        r = self.report
        assert r.dialect is not None
        path = _chat_path(r.dialect)
        try:
            answer, events = await self._request("POST", path, self._chat_body(r.dialect, tools=True), stream=True)
        except _Failed as f:
            r.tool_calls = f"failed: {f.problem}"
            return
        if events is None:
            r.tool_calls = f"refused: HTTP {answer.status}: {_message(answer.body)}"
            return
        calls = [tc for e in events for ch in e.get("choices") or () if isinstance(ch, dict)
                 for tc in ((ch.get("delta") or {}).get("tool_calls") or ()) if isinstance(tc, dict)]
        if not calls:
            r.tool_calls = "not_called"
        elif len(calls) == 1:
            r.tool_calls = "one_piece"
        elif all("index" in c for c in calls):
            r.tool_calls = "streamed"
        else:
            r.tool_calls = "streamed_without_index"

    async def _structured(self) -> None:
        """Does the server honour `response_format` (MindIE 2.3 and later do)? One small json_schema request."""
        r = self.report
        assert r.dialect is not None
        path = _chat_path(r.dialect)
        body = {"model": self._model(), "max_tokens": self.opts.max_tokens, "stream": False,
                "messages": [{"role": "user", "content": "Is water wet? Answer in JSON."}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": _SCHEMA}}}
        try:
            answer, _ = await self._request("POST", path, body)
        except _Failed as f:
            r.response_format = f"failed: {f.problem}"
            return
        if answer.status >= 400:
            r.response_format = f"refused: HTTP {answer.status}: {_message(answer.body)}"
            return
        try:
            content = orjson.loads(answer.body)["choices"][0]["message"]["content"]
            value = orjson.loads(content)
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            value = None
        r.response_format = "honoured" if isinstance(value, dict) and isinstance(value.get("ok"), bool) else "ignored"

    def _finish(self) -> Report:
        notes = self._info.notes if self._info is not None and self.report.answers_as is None else []
        self.report.config = config_block(self.report, self.opts, notes)
        return self.report


async def _read_events(resp: aiohttp.ClientResponse) -> list[dict[str, Any]]:
    decoder = SSEDecoder()
    events: list[dict[str, Any]] = []
    size = 0
    while len(events) < _MAX_EVENTS and size < _BODY_LIMIT:
        data = await resp.content.readany()
        if not data:
            break
        size += len(data)
        for ev in decoder.feed(data):
            if ev.data and ev.data != "[DONE]":
                try:
                    parsed = orjson.loads(ev.data)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(parsed, dict):
                    events.append(parsed)
    return events


def _analyse(r: Report, events: list[dict[str, Any]], model: str) -> None:
    """Cumulative text, reasoning form and usage placement from the events of one streamed answer."""
    contents: list[str] = []
    field_reasoning = False
    usage_places: set[str] = set()
    marked_full_text = False
    for e in events:
        choices = e.get("choices")
        marked_full_text = marked_full_text or "full_text" in e
        if isinstance(e.get("usage"), dict):
            usage_places.add(_usage_place(choices))
        for ch in choices or ():
            delta = ch.get("delta") if isinstance(ch, dict) else None
            if not isinstance(delta, dict):
                continue
            field_reasoning = field_reasoning or bool(delta.get("reasoning_content") or delta.get("reasoning"))
            if isinstance(delta.get("content"), str) and delta["content"]:
                contents.append(delta["content"])
    # Measured now (unknown until a stream was read).
    r.full_text = marked_full_text or _cumulative(contents)
    text = contents[-1] if r.full_text and contents else "".join(contents)
    r.reasoning = "field" if field_reasoning else _reasoning_in_text(text, model)
    r.usage = next((p for p in ("final_chunk", "finish_chunk", "every_chunk") if p in usage_places), "none")


def _usage_place(choices: Any) -> str:
    """Where an event that carries usage sits: the final `choices: []` chunk, a finish chunk, or any other."""
    if choices == []:
        return "final_chunk"
    if any(isinstance(c, dict) and c.get("finish_reason") for c in choices or ()):
        return "finish_chunk"
    return "every_chunk"


def _cumulative(contents: list[str]) -> bool:
    """Each text repeats the one before it and grows: a cumulative (MindIE fullTextEnabled) stream."""
    pairs = list(zip(contents, contents[1:], strict=False))
    return len(contents) >= 3 and any(b != a for a, b in pairs) and all(b.startswith(a) for a, b in pairs)


def _reasoning_in_text(text: str, model: str) -> str:
    """The reasoning form of an answer without a reasoning field: `<think>` tags, R1's lone `</think>`, or none."""
    if text.lstrip().startswith("<think>"):
        return "tags"
    if "</think>" in text:
        return "close_only"
    if R1_NAME.search(model):
        return "close_only"  # R1 names start inside the block even when no </think> came within max_tokens
    return "none"


def _detection_order() -> list[type[Dialect]]:
    """The spokes in the order their evidence is asked for: the generic one last."""
    return sorted(DIALECTS.values(), key=lambda spoke: spoke.probe.generic)


def _generic() -> type[Dialect]:
    return next(spoke for spoke in DIALECTS.values() if spoke.probe.generic)


def _chats(dialect: str) -> bool:
    """The dialect serves chat: its mapping has a chat path (those without serve embeddings or rerank only)."""
    return bool(load_mapping(dialect).paths.get("chat"))


def _chat_path(dialect: str) -> str:
    return load_mapping(dialect).paths.get("chat") or "/v1/chat/completions"


def _reset(exc: BaseException) -> bool:
    """The connection was made and then closed or reset (not refused, not a failed handshake)."""
    return isinstance(exc, aiohttp.ClientOSError | aiohttp.ServerDisconnectedError) and \
        not isinstance(exc, aiohttp.ClientConnectorError)


def _json(raw: bytes) -> Any:
    """A body parsed as JSON; None when it is not JSON."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def _model_cards(raw: bytes) -> list[dict[str, Any]] | None:
    data = _json(raw)
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        return [m for m in data["data"] if isinstance(m, dict) and isinstance(m.get("id"), str)]
    return None


def _error_shape(raw: bytes) -> str:
    if not raw.strip():
        return "empty"
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return "text"
    if isinstance(data, dict):
        for spoke in DIALECTS.values():
            if spoke.probe.error_shape(data):
                return spoke.name
        if "detail" in data:
            return "fastapi"
        if "message" in data:
            return "message"
    return "json"


def _message(raw: bytes) -> str:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", "replace").strip()[:200] or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            err = err.get("message")
        for value in (err, data.get("message"), data.get("detail")):
            if isinstance(value, str):
                return value[:200]
    return raw.decode("utf-8", "replace")[:200]


def _reason(e: BaseException) -> str:
    os_error = getattr(e, "os_error", None)
    if isinstance(os_error, OSError) and (os_error.strerror or os_error.args):
        return str(os_error.strerror or os_error.args[-1])[:200]
    return (str(e) or type(e).__name__)[:200]


def config_block(r: Report, opts: ProbeOptions, info_notes: list[str] | None = None) -> str:
    """The upstream entry for the proxy's YAML config file, from what the probe found; "" when the dialect is unknown
    (no block is better than one built on a guess). `info_notes`: the comment lines of what the server said of itself
    on its info path."""
    if r.dialect is None:
        return ""
    url = r.url
    if r.problems and r.tls != "none" and url.startswith("http://") and _hinted(r, "https://"):
        url = "https://" + url[len("http://"):]
    item = yaml.safe_dump([_entry(r, opts, r.dialect, url)], sort_keys=False, allow_unicode=True, width=120,
                          default_flow_style=False)
    lines = ["upstreams:", *("  " + line for line in item.splitlines())]
    if r.answers_as is not None:
        lines.append(f"    # warning: this server answers as the {r.answers_as} dialect, not {r.dialect} (--dialect): "
                     "see the probe's problems")
    lines.extend(DIALECTS[r.dialect].probe.config_notes(url))
    lines.extend(info_notes or ())
    if r.models and r.kinds is None:
        lines.append(f"    # it serves: {', '.join(r.models[:20])} (models: [\"*\"], the default, routes every "
                     "name here)")
    return "\n".join(lines) + "\n"


def _entry(r: Report, opts: ProbeOptions, dialect: str, url: str) -> dict[str, Any]:
    """The config block's upstream entry: only the settings whose default would be wrong for this server."""
    entry: dict[str, Any] = {"name": dialect, "dialect": dialect, "url": url}
    if r.kinds and r.answers_as is None:
        # The server named its one model and its kind on its info path: route that name here, for that kind only.
        entry["models"] = list(r.models)
        entry["kinds"] = list(r.kinds)
    spoke = DIALECTS[dialect]
    if r.full_text and spoke.full_text_mode:
        entry["full_text"] = True
    if opts.api_key_env or r.api_key_required:
        entry["api_key_env"] = opts.api_key_env or "UPSTREAM_API_KEY"
    if r.response_format == "honoured" and spoke.probe.structured_output:
        entry["response_format"] = "pass"  # structured output (MindIE >= 2.3): let clients' response_format through
    if r.reasoning == "close_only" and r.model_used and not R1_NAME.search(r.model_used):
        entry["thinking_models"] = [r.model_used]
    if r.tls != "none" or url.startswith("https://"):
        entry.update(_tls_entry(r, opts))
    return entry


def _hinted(r: Report, word: str) -> bool:
    """A problem's fix mentions `word` (a setting the block should then carry)."""
    return any(word in p["hint"] for p in r.problems)


def _tls_entry(r: Report, opts: ProbeOptions) -> dict[str, Any]:
    """The TLS settings of an upstream reached over TLS: those given, and placeholders for those a problem asks for."""
    entry: dict[str, Any] = {}
    if opts.tls_ca_file or _hinted(r, "tls_ca_file"):
        entry["tls_ca_file"] = opts.tls_ca_file or "/path/to/ca.pem"
    if opts.tls_cert_file or r.tls == "mutual_tls" or _hinted(r, "tls_cert_file"):
        entry["tls_cert_file"] = opts.tls_cert_file or "/path/to/client.pem"
        entry["tls_key_file"] = opts.tls_key_file or "/path/to/client.key"
    if not opts.tls_verify:
        entry["tls_verify"] = False
    return entry


async def probe(opts: ProbeOptions) -> Report:
    return await Prober(opts).run()
