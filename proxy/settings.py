"""Settings: one frozen object built from CLI flags, DIALECT_PROXY_* environment variables and the YAML file.

Precedence: flag > environment > config file > default (docs/decisions.md "Command line and configuration").
Each setting is declared once, on its field: `about(...)`
in the field's metadata says how a value is read and checked, and its flag, environment variable and help text
(with the default) follow from it (`Declared`; docs/development.md "Adding a setting"). Every problem is a
`ConfigError` whose message names where the value came from — the flag (`--port`), the environment variable
(`DIALECT_PROXY_PORT`) or the file's key path (`upstreams[0].dialect`); the CLI prints that one line and exits 2.
No stack trace.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final
from urllib.parse import unquote

import yaml

CLIENT_REASONING = ("reasoning_content", "reasoning", "think_tags", "none")
REASONING_SOURCES = ("auto", "field", "tags", "off")
REASONING_REPLAY = ("auto", "strip", "keep", "restore")  # proxy/hub/continuity.py
RESPONSES_SPECS = ("openai_api", "open_responses")  # proxy/clients/responses_events.py `reasoning_events`
RESPONSE_MODEL = ("client", "upstream")
MODEL_KINDS = ("chat", "embeddings", "rerank")  # what an upstream's models do (proxy/gateway/routing.py)
RESPONSE_FORMAT = ("pass", "emulate", "reject", "drop")  # proxy/hub/params.py
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
BALANCE = ("least_outstanding", "prefix_affinity")
READY_WHEN = ("all", "any")
ENV_PREFIX = "DIALECT_PROXY_"


class ConfigError(Exception):
    """A bad setting. The message names the key and is fit to show as the only output line."""


@dataclass(frozen=True, slots=True)
class Given:
    """A value as given, and where: the flag (`--port`), the environment variable (`DIALECT_PROXY_PORT`) or the
    config file's key path (`server.port`). Every message about the value names `where`."""

    value: Any
    where: str


# ---------------------------------------------------------------------------------------------------------------
# Reading one value: each takes (where, value) and returns the value or raises a ConfigError naming `where`.

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _did_you_mean(word: str, known: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def coerce_value(key: str, value: Any, kind: type, choices: tuple[str, ...] | None = None) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise ConfigError(f"{key}: expected a boolean (true/false, 1/0, yes/no), got {value!r}")
    if kind is int or kind is float:
        return _number(key, value, kind)
    if kind is str:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{key}: expected a non-empty string, got {value!r}")
        if choices and value not in choices:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(choices)}{_did_you_mean(value, choices)}")
        return value
    raise AssertionError(kind)


def _number(key: str, value: Any, kind: type) -> Any:
    what = "an integer" if kind is int else "a number"
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    if numeric and (kind is float or isinstance(value, int)):
        return kind(value)
    if isinstance(value, str):
        try:
            return kind(value.strip())
        except ValueError:
            pass
    raise ConfigError(f"{key}: expected {what}, got {value!r}")


def text(key: str, value: Any) -> str:
    """A non-empty string."""
    out: str = coerce_value(key, value, str)
    return out


def str_list(key: str, value: Any) -> tuple[str, ...]:
    """A list of strings, or one string of comma-separated items (as flags and environment variables give it)."""
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{key}: expected a list of strings, got {value!r}")
    return tuple(value)


def alias_map(key: str, value: Any) -> dict[str, str]:
    """Client model name -> upstream model name: a mapping, or `a=b,c=d` (flags and environment variables)."""
    if isinstance(value, str):
        value = dict(_alias_pair(key, item) for item in value.split(",") if item.strip())
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and k and v for k, v in value.items()
    ):
        raise ConfigError(f"{key}: expected a mapping of client model name to upstream model name")
    return dict(value)


def _alias_pair(key: str, item: str) -> tuple[str, str]:
    client, sep, upstream = (part.strip() for part in item.strip().partition("="))
    if not sep or not client or not upstream:
        raise ConfigError(f"{key}: {item.strip()!r} is not client=upstream (e.g. gpt-4o=DeepSeek-R1)")
    return client, upstream


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_var_name(key: str, value: Any) -> str:
    """The name of an environment variable. A value that is no such name is most likely the secret itself, pasted
    where its variable's name belongs: the message says so and never shows it."""
    name: str = coerce_value(key, value, str)
    if not _ENV_NAME.fullmatch(name):
        raise ConfigError(f"{key}: expects the NAME of an environment variable (e.g. MINDIE_API_KEY), not the key "
                          f"itself; the value given ({len(name)} characters) is not shown")
    return name


def http_url(key: str, value: Any) -> str:
    url: str = coerce_value(key, value, str)
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"{key}: expected an http:// or https:// URL, got {url!r}")
    return url


def existing_file(key: str, value: Any) -> str:
    path: str = coerce_value(key, value, str)
    if not os.path.isfile(path):
        raise ConfigError(f"{key}: no such file: {path}")
    return path


def url_list(key: str, value: Any) -> list[Any]:
    """`url`: one URL, several separated by commas, or a list of URLs or of {url, name, health_url} mappings (made
    into replicas by `_replicas`, which knows the upstream's health_url)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise ConfigError(f"{key}: expected a URL or a list of replica URLs, got {value!r}")
    # a repeated --upstream-url gives a list whose items may themselves hold commas
    urls = [part for item in value for part in (item.split(",") if isinstance(item, str) else [item])
            if not isinstance(part, str) or part.strip()]
    if not urls:
        raise ConfigError(f"{key}: expected a URL or a list of replica URLs, got {value!r}")
    return urls


def passthrough_value(key: str, value: Any) -> bool | tuple[str, ...]:
    """`passthrough`: client dialect names (a list, or one string with commas), or true/false for all/none of what
    the upstream's spoke serves natively (checked against the dialect by `passthrough_names`)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    return str_list(key, value)


def dialect_names() -> tuple[str, ...]:
    """The upstream dialects' names, from their spokes' registry (proxy/dialects/__init__.py: imported when first
    asked, as the spokes import this module's types)."""
    from proxy.dialects import DIALECTS

    return tuple(DIALECTS)


def usage_field_names() -> tuple[str, ...]:
    """The values of `client.usage_fields`: the dialects whose spokes offer their usage fields to chat clients."""
    from proxy.dialects import DIALECTS

    return tuple(name for name, spoke in DIALECTS.items() if spoke.offers_usage_fields)


def dialect_name(key: str, value: Any) -> str:
    """A dialect name, case-insensitive; a near miss gets a "did you mean"."""
    name: str = coerce_value(key, value, str).strip().lower()
    names = dialect_names()
    if name in names:
        return name
    raise ConfigError(f"{key}: {value!r} is not one of {', '.join(names)}{_did_you_mean(name, names)}")


def per_dialect(attribute: str) -> str:
    """A default each dialect's spoke sets in its `rules` (proxy/dialects/base.py RequestRules), in words:
    `x for a, b; else y` (y: the spokes' base class's)."""
    from proxy.dialects import DIALECTS
    from proxy.dialects.base import Dialect

    usual = getattr(Dialect.rules, attribute)
    others: dict[str, list[str]] = {}
    for name, spoke in sorted(DIALECTS.items()):
        value = getattr(spoke.rules, attribute)
        if value != usual:
            others.setdefault(value, []).append(name)
    return "".join(f"`{value}` for {', '.join(names)}; " for value, names in others.items()) + f"else `{usual}`"


def state_store_value(key: str, value: Any) -> str:
    """`memory`, or a Redis URL (proxy/state/urls.py: one server, Sentinel or Cluster) with hosts, valid ports and
    an optional /DB number. Messages show the URL without its credentials."""
    from proxy.state.urls import parse_store_url  # proxy.state imports this module

    url = text(key, value).strip()
    if url.lower() == "memory":
        return "memory"
    try:
        parse_store_url(url, redact_url(url))
    except ValueError as e:
        raise ConfigError(f"{key}: {e}") from None
    return url


# ---------------------------------------------------------------------------------------------------------------
# The declaration of a setting.

@dataclass(frozen=True, slots=True)
class Setting:
    """How one settings field is given and checked. Its config-file key is the field's name; its flag is `flag`, or
    the section's prefix (`upstream-`, `client-`, none for the server) and the name with '-'; its environment
    variable is DIALECT_PROXY_ and the flag in capitals with '_'."""

    help: str  # one line for --help and the docs; the default and the choices are added to it
    flag: str = ""
    parse: Callable[[str, Any], Any] | None = None  # None: by the default's type (bool, int, float; else a string)
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] = ()  # a callable: asked when read (the registry)
    minimum: float | None = None
    maximum: float | None = None
    positive: bool = False  # greater than 0
    default_text: str | Callable[[], str] = ""  # the default in words, where the value alone does not say it


def about(
    help: str,
    *,
    flag: str = "",
    parse: Callable[[str, Any], Any] | None = None,
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] = (),
    minimum: float | None = None,
    maximum: float | None = None,
    positive: bool = False,
    default_text: str | Callable[[], str] = "",
) -> dict[str, Any]:
    """A settings field's metadata: `port: int = field(default=8000, metadata=about("port to listen on"))`."""
    return {"setting": Setting(help, flag, parse, choices, minimum, maximum, positive, default_text)}


# ---------------------------------------------------------------------------------------------------------------
# The settings records. A field with `about(...)` is a setting; one without is worked out from the settings
# (a key read from its variable, the replicas from `url`).

@dataclass(frozen=True, slots=True)
class ReplicaSettings:
    """One server of an upstream (docs/gateway.md). `name` is the bounded `replica` metrics label: the configured
    name or the replica's index, never the URL (which may carry credentials)."""

    name: str
    url: str
    health_url: str | None = None


@dataclass(frozen=True, slots=True)
class UpstreamSettings:
    name: str = field(metadata=about("a name for the upstream in logs, metrics and /readyz",
                                     default_text="the dialect"))
    dialect: str = field(metadata=about("what the upstream speaks", parse=dialect_name, choices=dialect_names))
    url: str = field(metadata=about(
        "the upstream server's base URL, with or without /v1; several (a list, commas, or the flag repeated) are "
        "replicas of one upstream", parse=url_list))
    models: tuple[str, ...] = field(default=("*",), metadata=about(
        "client model names routed to the upstream; \"*\" = every name (the default route)", flag="models",
        parse=str_list))
    aliases: Mapping[str, str] = field(default_factory=dict, metadata=about(
        "client model name -> upstream model name, e.g. gpt-4o=DeepSeek-R1,gpt-4o-mini=Qwen3-8B", flag="aliases",
        parse=alias_map))
    full_text: bool = field(default=False, metadata=about(
        "the MindIE upstream runs with fullTextEnabled (cumulative stream text)", flag="full-text"))
    api_key_env: str | None = field(default=None, metadata=about(
        "name of the environment variable holding the upstream's API key (sent as Bearer)", parse=env_var_name))
    api_key: str | None = field(default=None, repr=False)
    health_url: str | None = field(default=None, metadata=about(
        "URL /readyz also asks (MindIE: its management port, e.g. http://127.0.0.1:1026/health)", parse=http_url))
    # The engine's own Prometheus metrics (MindIE: its metricsPort), read for the Model Server Protocol gauges
    # (proxy/metrics/model_server.py) with the same TLS options as the upstream.
    metrics_url: str | None = field(default=None, metadata=about(
        "the upstream engine's own /metrics URL (MindIE: its metricsPort, e.g. http://127.0.0.1:1027/metrics), read "
        "for server.model_server_metrics", parse=http_url))
    reasoning_source: str | None = field(default=None, metadata=about(  # None: the dialect's default
        "where the upstream puts reasoning", choices=REASONING_SOURCES,
        default_text=partial(per_dialect, "reasoning_source")))
    thinking_models: tuple[str, ...] = field(default=(), metadata=about(
        "upstream model names that start inside a <think> block", parse=str_list))
    reasoning_replay: str = field(default="auto", metadata=about(
        "reasoning on assistant turns sent back: removed, as sent, or restored (docs/deepseek.md)",
        choices=REASONING_REPLAY))
    keep_upstream_id: bool = field(default=False, metadata=about(
        "keep the upstream's response id instead of making one", flag="keep-upstream-id"))
    response_model: str = field(default="client", metadata=about(
        "`model` in answers: the name the client asked for, or the upstream's", choices=RESPONSE_MODEL))
    response_format: str | None = field(default=None, metadata=about(  # None: the dialect's (proxy/hub/params.py)
        "a client's response_format (structured output): sent, emulated (a forced tool call, or JSON checked and "
        "asked again: docs/structured-output.md), refused with a 400, or left out",
        choices=RESPONSE_FORMAT, default_text=partial(per_dialect, "response_format")))
    structured_attempts: int = field(default=3, metadata=about(
        "answers asked of the upstream for one emulated structured-output request before the client gets the "
        "`structured_output_failed` error (the first answer and the re-asks)", minimum=1, maximum=10))
    max_connections: int = field(default=1000, metadata=about(
        "connection pool size to the upstream (per replica)", positive=True))
    # Client dialects sent to this upstream untranslated (proxy/endpoint/passthrough.py): names its spoke serves
    # natively.
    passthrough: tuple[str, ...] = field(default=(), metadata=about(
        "client dialects sent to the upstream untranslated, where it serves them natively (e.g. responses for "
        "openai, messages for deepseek; docs/passthrough.md), or true for all of them", parse=passthrough_value))
    # The kinds of model it serves (docs/retrieval.md). Parsed settings always name them (by default all its dialect
    # serves: its mapping's paths); empty, in settings made by hand, is chat alone.
    kinds: tuple[str, ...] = field(default=(), metadata=about(
        "the kinds of model it serves: chat, embeddings, rerank (docs/retrieval.md)", parse=str_list,
        default_text="all its dialect serves"))
    # TLS to the upstream (MindIE with httpsEnabled uses mutual TLS): CA bundle to verify the server, client
    # certificate and key to present; tls_verify false accepts any server certificate (testing only).
    tls_ca_file: str | None = field(default=None, metadata=about(
        "CA bundle to verify an https upstream (e.g. MindIE with httpsEnabled)", parse=existing_file,
        default_text="system CAs"))
    tls_cert_file: str | None = field(default=None, metadata=about(
        "client certificate for mutual TLS to the upstream", parse=existing_file))
    tls_key_file: str | None = field(default=None, metadata=about(
        "private key of that client certificate", parse=existing_file))
    tls_verify: bool = field(default=True, metadata=about(
        "verify the upstream's certificate (false is for testing only)"))
    # Gateway (docs/gateway.md): replicas of this upstream, failover, balancing, passive/active health, admission.
    replicas: tuple[ReplicaSettings, ...] = ()  # from `url`; empty = one replica at `url` (with `health_url`)
    retries: int = field(default=2, metadata=about(
        "replicas: tries on another replica after a failure before the first byte", minimum=0))
    balance: str = field(default="least_outstanding", metadata=about(
        "replicas: fewest requests under way, or the conversation's replica", choices=BALANCE))
    max_in_flight: int = field(default=0, metadata=about(
        "requests at once per replica (per worker); 0 = unlimited", minimum=0))
    queue_size: int = field(default=0, metadata=about(
        "requests that may wait per replica when it is at max_in_flight; beyond: 429", minimum=0))
    queue_timeout: float = field(default=30.0, metadata=about(
        "seconds a request may wait in that queue before a 429", minimum=0))
    outlier_failures: int = field(default=3, metadata=about(
        "passive health: failures in a row that take a replica out (0 = off)", minimum=0))
    outlier_backoff: float = field(default=5.0, metadata=about(
        "seconds a replica stays out, doubled per ejection", minimum=0.001))
    outlier_backoff_max: float = field(default=300.0, metadata=about(
        "the longest a replica stays out, in seconds", minimum=0.001))
    health_interval: float = field(default=10.0, metadata=about(
        "active health: seconds between probes of each replica's health_url (several replicas; 0 = off)",
        minimum=0))
    affinity_load: float = field(default=1.25, metadata=about(
        "prefix_affinity: a replica's load bound, times the mean", minimum=1.0))
    affinity_turns: int = field(default=1, metadata=about(
        "prefix_affinity: the non-system messages that make the conversation's key", minimum=0))

    def replica_list(self) -> tuple[ReplicaSettings, ...]:
        return self.replicas or (ReplicaSettings("0", self.url, self.health_url),)


@dataclass(frozen=True, slots=True)
class ClientSettings:
    reasoning: str = field(default="reasoning_content", metadata=about(
        "how clients receive reasoning", choices=CLIENT_REASONING))
    usage_fields: str | None = field(default=None, metadata=about(  # None: OpenAI's usage fields alone
        "a dialect whose own usage fields (such as its prompt cache counts) chat clients get too",
        choices=usage_field_names, default_text="none (OpenAI's usage fields alone)"))
    # which of the two Responses specifications /v1/responses follows where they differ (docs/responses.md)
    responses_spec: str = field(default="openai_api", metadata=about(
        "the Responses specification /v1/responses follows where the two differ (the raw-reasoning event names: "
        "response.reasoning_text.* or response.reasoning.*)", choices=RESPONSES_SPECS))
    # env var with the secret that signs Anthropic `thinking` blocks (proxy/clients/signature.py); none: a random
    # key per process, so signatures do not verify across workers, replicas or restarts (docs/messages.md)
    thinking_key_env: str | None = field(default=None, metadata=about(
        "name of the environment variable holding the secret that signs thinking/reasoning blocks (set it for "
        "several workers or replicas)", parse=env_var_name, default_text="a random key per process"))
    thinking_key: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class ServerSettings:
    host: str = field(default="127.0.0.1", metadata=about(
        "address to listen on (the container image sets 0.0.0.0)"))
    port: int = field(default=8000, metadata=about("port to listen on", minimum=0, maximum=65535))
    workers: int = field(default=1, metadata=about(
        "worker processes; >1 turns on Prometheus multiprocess mode (and needs a Redis state store)",
        positive=True))
    log_level: str = field(default="info", metadata=about(
        "log level; info writes one JSON access line per request", choices=LOG_LEVELS))
    log_bodies: bool = field(default=False, metadata=about(
        "log request/response bodies at debug level, secrets redacted"))
    max_body_bytes: int = field(default=4 * 1024 * 1024, metadata=about(
        "largest accepted request body in bytes; larger gets 413", positive=True))
    connect_timeout: float = field(default=10.0, metadata=about(
        "seconds to connect to an upstream", positive=True))
    first_byte_timeout: float = field(default=600.0, metadata=about(
        "seconds to wait for an upstream's response headers", positive=True))
    idle_timeout: float = field(default=300.0, metadata=about(
        "seconds of upstream silence allowed between two reads of its answer", positive=True))
    total_timeout: float = field(default=1800.0, metadata=about(
        "seconds one upstream exchange may take in all", positive=True))
    keepalive_interval: float = field(default=15.0, metadata=about(
        "seconds of silence before an SSE ': keep-alive' comment goes to the client", positive=True))
    shutdown_grace: float = field(default=30.0, metadata=about(
        "seconds in-flight requests get to finish after SIGTERM", minimum=0))
    readiness_timeout: float = field(default=2.0, metadata=about(
        "seconds /readyz waits for each upstream", positive=True))
    ready_when: str = field(default="all", metadata=about(  # every upstream up (a sidecar), or any (a gateway)
        "/readyz is 200 when all (a sidecar) or any (a gateway) of the upstreams answer", choices=READY_WHEN))
    # A member of a Kubernetes InferencePool (docs/inference-gateway.md): the Endpoint Picker chooses the pod, the
    # sidecar fronts its own engine only.
    model_server_metrics: bool = field(default=False, metadata=about(
        "/metrics adds the Model Server Protocol gauges an Inference Gateway's Endpoint Picker reads "
        "(vllm:num_requests_waiting, vllm:num_requests_running, vllm:kv_cache_usage_perc), from the upstream's "
        "metrics_url and this proxy's own queue (docs/inference-gateway.md)"))
    pool_member: bool = field(default=False, metadata=about(
        "pool-member mode: the sidecar fronts its own pod's engine in an InferencePool — one upstream, one replica, "
        "no balancing; /readyz follows the engine's health endpoint; implies model_server_metrics"))
    api_keys_env: str | None = field(default=None, metadata=about(
        "name of an environment variable holding the comma-separated API keys clients must send on /v1/*",
        parse=env_var_name, default_text="none (open)"))
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    api_keys_file: str | None = field(default=None, metadata=about(
        "YAML file mapping key names to client API keys (name: key); the name goes to the access log and the "
        "`key` metrics label"))
    api_keys_store: bool = field(default=False, metadata=about(
        "also accept the keys `dialect-proxy keys create` keeps in the Redis of state_store (shared by every "
        "replica; a revoked key is refused within 1 s)"))
    api_key_names: tuple[str, ...] = ()  # one per api_keys entry: the file's names, `env-1`, `env-2`, ... for env keys
    # The state store (proxy/state/): "memory" (per process) or a redis:// / rediss:// URL (may hold a password).
    state_store: str = field(default="memory", repr=False, metadata=about(
        "where state that outlives a request is kept: memory (per process) or a redis://[:PASSWORD@]HOST:PORT/DB, "
        "rediss://, redis+sentinel:// or redis+cluster:// URL shared by replicas", parse=state_store_value))
    state_max_entries: int = field(default=10_000, metadata=about(
        "memory store: most entries kept, oldest out first", positive=True))
    state_max_bytes: int = field(default=256 * 1024 * 1024, metadata=about(
        "memory store: most bytes kept, oldest out first", positive=True))
    state_ttl: float = field(default=24 * 3600.0, metadata=about(
        "seconds each stored entry lives, memory or Redis", positive=True))
    state_timeout: float = field(default=2.0, metadata=about(
        "seconds to connect to / hear from Redis before a 503 (an operation gives up after twice that)",
        positive=True))
    # Per-key limits (proxy/gateway/limits.py, docs/sharing.md): counted in the Redis of state_store, else per process.
    limits_fail: str = field(default="open", metadata=about(
        "when the Redis that counts per-key limits does not answer: open (count in each process, its share of every "
        "limit) or closed (503)", choices=("open", "closed")))
    limits_timeout: float = field(default=0.25, metadata=about(
        "seconds the limiter waits for Redis on a request before limits_fail applies", positive=True))
    limits_processes: int = field(default=1, metadata=about(
        "how many proxy processes (replicas x workers) share the limits: each one's share while failing open",
        positive=True))
    limits_window: float = field(default=60.0, metadata=about(
        "seconds of the sliding window of requests_per_minute and tokens_per_minute (60; shorter in tests)",
        positive=True))
    limits_output_estimate: int = field(default=1024, metadata=about(
        "output tokens reserved for a request of a limited key that names no max_tokens (settled to the real "
        "usage)", positive=True))
    # The HTTP front end (proxy/server/frontend.py): request head size, time to receive a request, open connections.
    max_header_bytes: int = field(default=65536, metadata=about(
        "largest accepted request line + headers in bytes; larger gets 431", positive=True))
    header_timeout: float = field(default=10.0, metadata=about(
        "seconds a client has to send a request's line and headers; slower gets 408", positive=True))
    body_timeout: float = field(default=60.0, metadata=about(
        "seconds a client has to send a request's body once its headers are in; slower gets 408", positive=True))
    max_client_connections: int = field(default=2048, metadata=about(
        "open client connections accepted; more get 503 at once", positive=True))
    ws_idle_timeout: float = field(default=600.0, metadata=about(
        "seconds a WebSocket (Responses WebSocket mode) may stay without a message either way", positive=True))
    ws_max_age: float = field(default=3600.0, metadata=about(  # the Open Responses spec's 60 minutes
        "seconds a Responses WebSocket may stay open; then websocket_connection_limit_reached", positive=True))


@dataclass(frozen=True, slots=True)
class Settings:
    upstreams: tuple[UpstreamSettings, ...]
    client: ClientSettings = ClientSettings()
    server: ServerSettings = ServerSettings()
    # The environment's OTEL_* variables, as OpenTelemetry names them (proxy/metrics/tracing.py reads them; may hold a
    # collector's key in OTEL_EXPORTER_OTLP_HEADERS, so kept out of repr).
    otel: tuple[tuple[str, str], ...] = field(default=(), repr=False)


# ---------------------------------------------------------------------------------------------------------------
# The declarations, read back from the records: what the command line, the docs test and the builder use.

_SECTIONS: tuple[tuple[str, type, str], ...] = (
    ("server", ServerSettings, ""), ("client", ClientSettings, "client-"), ("upstream", UpstreamSettings, "upstream-"),
)


@dataclass(frozen=True, slots=True)
class Declared:
    """One setting as declared: its section (`server`, `client` or `upstream`: `upstreams[]` in the file), its
    key, its default (None when required) and its `Setting`."""

    section: str
    name: str
    required: bool
    default: Any
    setting: Setting
    flag: str  # without "--"
    env: str

    def choices(self) -> tuple[str, ...]:
        c = self.setting.choices
        return c if isinstance(c, tuple) else c()

    def default_words(self) -> str:
        """The default as the help text and the docs say it."""
        words = self.setting.default_text
        if words:
            return words if isinstance(words, str) else words()
        if self.required:
            return "required"
        return _words(self.default)

    def help(self) -> str:
        choices = self.choices()
        one_of = f"; one of {', '.join(choices)}" if choices else ""
        line = f"{self.setting.help}{one_of} (default: {self.default_words()}) [env {self.env}]"
        return line.replace("`", "")  # the docs' code marks

    def read(self, given: Given) -> Any:
        """The value, parsed and checked; a ConfigError names `given.where`."""
        s = self.setting
        where = given.where
        if s.parse is not None:
            value = s.parse(where, given.value)
        elif isinstance(self.default, bool | int | float):
            value = coerce_value(where, given.value, type(self.default))
        else:
            value = text(where, given.value)
        if isinstance(value, str) and s.choices:
            value = coerce_value(where, value, str, self.choices())
        if s.positive and value <= 0:
            raise ConfigError(f"{where}: must be greater than 0, got {value!r}")
        if s.minimum is not None and value < s.minimum:
            raise ConfigError(f"{where}: must be at least {s.minimum:g}, got {value!r}")
        if s.maximum is not None and value > s.maximum:
            raise ConfigError(f"{where}: must be at most {s.maximum:g}, got {value!r}")
        return value


def _words(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}" if value != int(value) else str(int(value))
    if isinstance(value, tuple):
        return "[" + ", ".join(f'"{v}"' for v in value) + "]"
    if isinstance(value, Mapping):
        return "{}" if not value else repr(dict(value))
    return str(value)


def declared(section: str | None = None) -> tuple[Declared, ...]:
    """Every declared setting (of one section), in the records' order."""
    out: list[Declared] = []
    for name, cls, prefix in _SECTIONS:
        if section is not None and name != section:
            continue
        out += [_declaration(name, prefix, f) for f in dataclasses.fields(cls) if "setting" in f.metadata]
    return tuple(out)


def _declaration(section: str, prefix: str, f: dataclasses.Field[Any]) -> Declared:
    s: Setting = f.metadata["setting"]
    default: Any = f.default
    if f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    required = default is dataclasses.MISSING
    flag = s.flag or prefix + f.name.replace("_", "-")
    return Declared(section, f.name, required, None if required else default, s, flag,
                    ENV_PREFIX + flag.upper().replace("-", "_"))


def env_names() -> tuple[str, ...]:
    """Every DIALECT_PROXY_* variable `serve` reads (the settings' and DIALECT_PROXY_CONFIG)."""
    return (*(d.env for d in declared()), ENV_PREFIX + "CONFIG")


# ---------------------------------------------------------------------------------------------------------------
# Where values come from: the config file's sections, and the command line (flags over environment variables).

def _unknown(prefix: str, data: Mapping[str, Any], known: tuple[str, ...]) -> None:
    for key in data:
        if key not in known:
            hint = _did_you_mean(str(key), known)
            raise ConfigError(f"{prefix}{key}: unknown key" + (hint or f" (known keys: {', '.join(known)})"))


def file_section(prefix: str, data: Any, section: str) -> dict[str, Given]:
    """One section of the config file (`server.`, `client.`, `upstreams[0].`) as given values; null is not given."""
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix.rstrip('.')}: expected a mapping, got {data!r}")
    _unknown(prefix, data, tuple(d.name for d in declared(section)))
    return {k: Given(v, prefix + k) for k, v in data.items() if v is not None}


def command_line(flags: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, dict[str, Given]]:
    """The settings given as flags (`flags`: argparse's values by dest, None when absent) or as DIALECT_PROXY_*
    variables, the flag first; by section."""
    out: dict[str, dict[str, Given]] = {name: {} for name, _, _ in _SECTIONS}
    for d in declared():
        value = flags.get(d.flag.replace("-", "_"))
        if value is not None:
            out[d.section][d.name] = Given(value, "--" + d.flag)
        elif environ.get(d.env):
            out[d.section][d.name] = Given(environ[d.env], d.env)
    return out


def _as_given(prefix: str, values: Mapping[str, Any] | None) -> dict[str, Given]:
    """Values passed in code (the demo, tests): Given records as they are, plain values named `prefix` + key."""
    return {k: v if isinstance(v, Given) else Given(v, prefix + k) for k, v in (values or {}).items() if v is not None}


def read_section(section: str, given: Mapping[str, Given]) -> dict[str, Any]:
    by_name = {d.name: d for d in declared(section)}
    return {name: by_name[name].read(g) for name, g in given.items()}


# ---------------------------------------------------------------------------------------------------------------
# What one setting cannot check alone.

def _secret_from_env(given: Given, name: str, environ: Mapping[str, str]) -> str:
    value = environ.get(name)
    if not value:
        raise ConfigError(f"{given.where}: environment variable {name} is not set")
    return value


def _client_keys(values: dict[str, Any], given: Mapping[str, Given], environ: Mapping[str, str]) -> None:
    """`api_keys_env` and `api_keys_file` -> `api_keys` and their names (`env-1`, ... and the file's)."""
    keys: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    if values.get("api_keys_env"):
        name = values["api_keys_env"]
        keys = tuple(k.strip() for k in environ.get(name, "").split(",") if k.strip())
        if not keys:
            raise ConfigError(f"{given['api_keys_env'].where}: environment variable {name} is not set "
                              "(or holds no key)")
        names = tuple(f"env-{i + 1}" for i in range(len(keys)))
    if values.get("api_keys_file"):
        file_names, file_keys = load_api_keys_file(values["api_keys_file"], given["api_keys_file"].where)
        names = (*names, *file_names)
        for i, n in enumerate(names):
            if names.index(n) != i:
                raise ConfigError(f"{given['api_keys_file'].where}: the key name {n!r} is used twice")
        keys = (*keys, *file_keys)
    if keys:
        values["api_keys"] = keys
        values["api_key_names"] = names


def _replicas(url: Given, raw: list[Any], health: Given | None) -> tuple[ReplicaSettings, ...]:
    """`url` (from `url_list`) as replicas; `health_url` goes to the one replica, and is refused for several."""
    key = url.where
    listed = isinstance(url.value, list)
    out: list[ReplicaSettings] = []
    for i, item in enumerate(raw):
        where = f"{key}[{i}]" if listed or len(raw) > 1 else key
        out.append(_replica(where, i, item))
    names = [r.name for r in out]
    for i, n in enumerate(names):
        if names.index(n) != i:
            raise ConfigError(f"{key}[{i}].name: {n!r} is used twice (give each replica its own name)")
    if health is not None:
        if len(out) > 1:
            raise ConfigError(f"{health.where}: with several replicas, give each its own health_url "
                              "(url: [{url: ..., health_url: ...}, ...])")
        out[0] = ReplicaSettings(out[0].name, out[0].url, http_url(health.where, health.value))
    return tuple(out)


_REPLICA_KEYS = ("url", "name", "health_url")
_LABEL = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def _replica(where: str, i: int, item: Any) -> ReplicaSettings:
    if not isinstance(item, Mapping):
        return ReplicaSettings(str(i), normalize_url(where, text(where, item)), None)
    _unknown(where + ".", item, _REPLICA_KEYS)
    if "url" not in item:
        raise ConfigError(f"{where}.url: missing (required for every replica)")
    name = text(where + ".name", item.get("name", str(i)))
    if not _LABEL.fullmatch(name):
        raise ConfigError(f"{where}.name: {name!r} must be 1-64 letters, digits, '_', '.' or '-' "
                          "(it is a metrics label)")
    health = item.get("health_url")
    url = normalize_url(where + ".url", text(where + ".url", item["url"]))
    return ReplicaSettings(name, url, None if health is None else http_url(where + ".health_url", health))


def normalize_url(key: str, url: str) -> str:
    """Accept the server's base URL with or without a trailing `/v1` (users paste OpenAI-style base URLs)."""
    url = url.strip()
    if not (url.startswith("http://") or url.startswith("https://")):
        raise ConfigError(f"{key}: expected an http:// or https:// URL, got {url!r}")
    url = url.rstrip("/")
    url = url.removesuffix("/v1")
    return url


def passthrough_names(key: str, value: bool | tuple[str, ...], dialect: str) -> tuple[str, ...]:
    """`passthrough` (from `passthrough_value`) checked against what the dialect's spoke serves natively (its
    mapping's `native`); `true` names them all, `false` none."""
    from proxy.dialects import DIALECTS

    served = tuple(DIALECTS[dialect].native_routes())
    if isinstance(value, bool):
        return served if value else ()
    for name in value:
        if name not in served:
            which = ", ".join(served) if served else "none"
            raise ConfigError(f"{key}: {name!r} is not a client dialect the {dialect} dialect serves natively "
                              f"(it serves: {which})")
    return tuple(dict.fromkeys(value))


def model_kinds(key: str, value: tuple[str, ...] | None, dialect: str) -> tuple[str, ...]:
    """`kinds` checked against what the dialect serves (a path for the kind in its mapping); none given: all of
    those."""
    from proxy.dialects.mapping import load_mapping

    paths = load_mapping(dialect).paths
    served = tuple(kind for kind in MODEL_KINDS if paths.get(kind))
    if value is None:
        return served
    for kind in value:
        if kind not in served:
            raise ConfigError(f"{key}: {kind!r} is not a kind of model the {dialect} dialect serves "
                              f"(it serves: {', '.join(served)})")
    if not value:
        raise ConfigError(f"{key}: name at least one of {', '.join(served)}")
    return tuple(dict.fromkeys(value))


def _check_tls(values: Mapping[str, Any], given: Mapping[str, Given]) -> None:
    """A client certificate needs its key, and both load now: a bad file stops start-up, not the first request."""
    ca, cert, key = (values.get(k) for k in ("tls_ca_file", "tls_cert_file", "tls_key_file"))
    if bool(cert) != bool(key):
        which = given["tls_cert_file" if cert else "tls_key_file"].where
        raise ConfigError(f"{which}: a client certificate needs both tls_cert_file and tls_key_file")
    try:
        ctx = ssl.create_default_context(cafile=ca)
        if cert and key:
            ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError, ValueError) as e:
        which = given["tls_cert_file" if cert else "tls_ca_file"].where
        raise ConfigError(f"{which}: cannot load the TLS files ({e})") from None


def build_upstream(prefix: str, given: Mapping[str, Given], environ: Mapping[str, str]) -> UpstreamSettings:
    """One upstream from its given values (`prefix`: `upstreams[0].`, or `upstream.` for the flags' one)."""
    for required in ("dialect", "url"):
        if required not in given:
            raise ConfigError(f"{prefix}{required}: missing (required for every upstream)")
    values = read_section("upstream", given)
    dialect = values["dialect"]
    values.setdefault("name", dialect)
    replicas = _replicas(given["url"], values["url"], given.get("health_url"))
    values["url"] = replicas[0].url
    values["replicas"] = replicas
    if len(replicas) == 1:
        values["health_url"] = replicas[0].health_url
    if "passthrough" in values:
        values["passthrough"] = passthrough_names(given["passthrough"].where, values["passthrough"], dialect)
    where = given["kinds"].where if "kinds" in given else prefix + "kinds"
    values["kinds"] = model_kinds(where, values.get("kinds"), dialect)
    if "api_key_env" in values:
        values["api_key"] = _secret_from_env(given["api_key_env"], values["api_key_env"], environ)
    _check_tls(values, given)
    if values.get("queue_size") and not values.get("max_in_flight"):
        raise ConfigError(f"{given['queue_size'].where}: a queue needs max_in_flight (the queue holds what is "
                          "over it)")
    return UpstreamSettings(**values)


def load_api_keys_file(path: str, key: str = "server.api_keys_file") -> tuple[tuple[str, ...], tuple[str, ...]]:
    """`api_keys_file`: a YAML mapping of key name -> key, or -> a policy with its `key` or `key_sha256` (read whole
    by proxy/gateway/keys.py). Returns (names, keys; "" for a key known by its hash alone). Never shows a key."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"{key}: {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{key}: {path} is not valid YAML{_yaml_where(e)} (expected a mapping of key name to "
                          "key)") from None
    if not isinstance(data, Mapping) or not data:
        raise ConfigError(f"{key}: {path} must be a non-empty mapping of key name to key")
    names: list[str] = []
    keys: list[str] = []
    for name, value in data.items():
        if name == "default":  # the policy of keys that do not say (proxy/gateway/keys.py), not a key
            continue
        if not isinstance(name, str) or not _LABEL.fullmatch(name):
            raise ConfigError(f"{key}: key name {name!r} must be 1-64 letters, digits, '_', '.' or '-' "
                              "(it is a metrics label)")
        if isinstance(value, Mapping):  # a key with its policy (proxy/gateway/keys.py reads the rest)
            value = value.get("key", "") if "key_sha256" not in value else "-"
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{key}: the key named {name!r} must be a non-empty string (or a mapping with `key` "
                              "or `key_sha256`)")
        names.append(name)
        keys.append(value.strip() if value != "-" else "")  # "": known by its hash alone
    return tuple(names), tuple(keys)


# Query parameters that carry a credential, by name (case-insensitive, `-` read as `_`): these names, and any name
# ending in one of _SECRET_SUFFIXES (`x_api_key`, `refresh_token`, `client_secret` ...). Redis's own URL parameters
# (`password`, `username`, the sentinel's) are among them.
_SECRET_PARAMS: Final = frozenset({
    "key", "api_key", "apikey", "token", "access_token", "auth", "authorization", "sig", "signature", "password",
    "passwd", "pwd", "secret", "credential", "credentials", "username",
})
_SECRET_SUFFIXES: Final = ("_key", "_token", "_secret", "_password", "_signature", "_sig", "_username", "_credential")
_HIDDEN = "***"


def _secret_param(name: str) -> bool:
    name = unquote(name).lower().replace("-", "_")
    return name in _SECRET_PARAMS or name.endswith(_SECRET_SUFFIXES)


def redact_url(url: str) -> str:
    """The one redaction of a URL for anything that leaves the proxy's memory (log lines, error messages, /readyz,
    traces): its user info and the values of credential-like query parameters become ***. Works on the string (not
    urlsplit), so that an unescaped '/', '#' or '?' in a password cannot slip through."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return _HIDDEN if "@" in url else url
    if "@" in rest:
        rest = _HIDDEN + "@" + rest.rpartition("@")[2]
    base, q, query = rest.partition("?")
    if q:
        query, hash_, fragment = query.partition("#")
        pairs = [p.partition("=") for p in query.split("&")]
        query = "&".join(k + e + (_HIDDEN if e and _secret_param(k) else v) for k, e, v in pairs) + hash_ + fragment
    return scheme + sep + base + q + query


def url_secrets(url: str) -> tuple[str, ...]:
    """The credentials a URL carries (raw and unquoted), to scrub from any text that might echo them."""
    rest = url.partition("://")[2]
    userinfo = rest.rpartition("@")[0]
    found = [userinfo, userinfo.partition(":")[2]]
    query = rest.partition("?")[2].partition("#")[0]
    found += [v for k, _, v in (p.partition("=") for p in query.split("&")) if _secret_param(k)]
    return tuple(s for f in found if f for s in {f, unquote(f)})


def load_config_file(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"config file {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path}: not valid YAML{_yaml_where(e)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping at the top level")
    return data


def _yaml_where(e: yaml.YAMLError) -> str:
    """` at line L, column C: the parser's reason (while ... at line L, column C)` (1-based, as editors count)."""
    if not isinstance(e, yaml.MarkedYAMLError) or e.problem_mark is None:
        return ""
    out = f" at {_mark(e.problem_mark)}: {e.problem}"
    if e.context and e.context_mark is not None:
        out += f" ({e.context} at {_mark(e.context_mark)})"
    return out


def _mark(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _upstream_list(config: Mapping[str, Any], single: Mapping[str, Any] | None,
                   environ: Mapping[str, str]) -> tuple[UpstreamSettings, ...]:
    if single is not None:
        if config.get("upstreams"):
            raise ConfigError("--upstream-url and a config file's upstreams cannot be used together")
        return (build_upstream("upstream.", _as_given("upstream.", single), environ),)
    raw = config.get("upstreams")
    if not raw:
        raise ConfigError("upstreams: no upstream configured (give --upstream-url or a config file)")
    if not isinstance(raw, list):
        raise ConfigError("upstreams: expected a list of upstreams")
    upstreams = tuple(build_upstream(f"upstreams[{i}].", file_section(f"upstreams[{i}].", u, "upstream"), environ)
                      if isinstance(u, Mapping) else _not_a_mapping(f"upstreams[{i}]", u) for i, u in enumerate(raw))
    names = [u.name for u in upstreams]
    for i, n in enumerate(names):
        if names.index(n) != i:
            raise ConfigError(f"upstreams[{i}].name: {n!r} is used twice (give each upstream its own name)")
    return upstreams


def _not_a_mapping(key: str, value: Any) -> UpstreamSettings:
    raise ConfigError(f"{key}: expected a mapping, got {value!r}")


def build_settings(
    *,
    config: Mapping[str, Any] | None = None,
    server_overrides: Mapping[str, Any] | None = None,
    client_overrides: Mapping[str, Any] | None = None,
    single_upstream: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Build settings from a parsed config mapping and override mappings (the command line's, flag over
    environment: `Given` values, or plain ones, named `server.<key>` ...). Overrides win over the file.

    `single_upstream` is the `--upstream-url` form: one upstream that takes every model name.
    """
    environ = os.environ if environ is None else environ
    config = dict(config or {})
    _unknown("", config, ("upstreams", "client", "server"))
    server_given = {**file_section("server.", config.get("server"), "server"),
                    **_as_given("server.", server_overrides)}
    client_given = {**file_section("client.", config.get("client"), "client"),
                    **_as_given("client.", client_overrides)}
    server_values = read_section("server", server_given)
    _client_keys(server_values, server_given, environ)
    client_values = read_section("client", client_given)
    if "thinking_key_env" in client_values:
        client_values["thinking_key"] = _secret_from_env(client_given["thinking_key_env"],
                                                         client_values["thinking_key_env"], environ)
    otel = tuple(sorted((k, v) for k, v in environ.items() if k.startswith("OTEL_")))
    settings = Settings(upstreams=_upstream_list(config, single_upstream, environ),
                        client=ClientSettings(**client_values), server=ServerSettings(**server_values), otel=otel)
    _check_pool_member(settings)
    if otel:
        from proxy.metrics.tracing import OtelConfig

        OtelConfig.parse(dict(otel))  # a mistake in them stops start-up here, with the variable's name
    return settings


def _check_pool_member(settings: Settings) -> None:
    """Pool-member mode and the Model Server Protocol gauges describe one engine: the pod's (docs/inference-gateway.md).
    """
    server = settings.server
    if not (server.model_server_metrics or server.pool_member):
        return
    what = "server.pool_member" if server.pool_member else "server.model_server_metrics"
    if len(settings.upstreams) != 1:
        raise ConfigError(f"{what}: the gauges describe one engine; configure exactly one upstream (the pod's own), "
                          f"not {len(settings.upstreams)}")
    if server.workers != 1:
        raise ConfigError(f"{what}: every worker keeps its own queue, so a scrape of one would show part of it; "
                          "run one worker (server.workers: 1)")
    u = settings.upstreams[0]
    if server.pool_member and len(u.replica_list()) != 1:
        raise ConfigError(f"{what}: the Endpoint Picker balances the pool; give upstream `{u.name}` one url (its own "
                          f"pod's engine), not {len(u.replica_list())} replicas")
    from proxy.dialects import DIALECTS

    if DIALECTS[u.dialect].engine_metrics is None:
        raise ConfigError(f"{what}: the {u.dialect} dialect's engine metrics are not known to the proxy; the "
                          "Endpoint Picker can scrape such an engine itself")
    if u.metrics_url is None:
        raise ConfigError(f"{what}: set upstreams[0].metrics_url, the engine's own /metrics (MindIE: its metricsPort, "
                          "with MIES_SERVICE_MONITOR_MODE=1)")
