"""Settings: one frozen object built from CLI flags, DIALECT_PROXY_* environment variables and the YAML file.

Precedence: flag > environment > config file > default (DECISIONS.md). Every problem is a `ConfigError` whose
message names the key, e.g. ``upstreams[0].dialect: 'mindy' is not one of deepseek, engine, ...``; the CLI prints
that one line and exits 2. No stack trace.
"""

from __future__ import annotations

import difflib
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import yaml

CLIENT_REASONING = ("reasoning_content", "reasoning", "think_tags", "none")
REASONING_SOURCES = ("auto", "field", "tags", "off")
REASONING_REPLAY = ("auto", "strip", "keep", "restore")  # proxy/hub/continuity.py
RESPONSES_SPECS = ("openai_api", "open_responses")  # proxy/clients/responses_events.py `reasoning_events`
RESPONSE_MODEL = ("client", "upstream")
MODEL_KINDS = ("chat", "embeddings", "rerank")  # what an upstream's models do (proxy/gateway/routing.py)
RESPONSE_FORMAT = ("pass", "reject", "drop")  # proxy/hub/params.py
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
BALANCE = ("least_outstanding", "prefix_affinity")


class ConfigError(Exception):
    """A bad setting. The message names the key and is fit to show as the only output line."""


@dataclass(frozen=True, slots=True)
class ReplicaSettings:
    """One server of an upstream (docs/gateway.md). `name` is the bounded `replica` metrics label: the configured
    name or the replica's index, never the URL (which may carry credentials)."""

    name: str
    url: str
    health_url: str | None = None


@dataclass(frozen=True, slots=True)
class UpstreamSettings:
    name: str
    dialect: str
    url: str
    models: tuple[str, ...] = ("*",)
    aliases: Mapping[str, str] = field(default_factory=dict)
    full_text: bool = False
    api_key_env: str | None = None
    api_key: str | None = field(default=None, repr=False)
    health_url: str | None = None
    reasoning_source: str | None = None  # None = the dialect's default (field for deepseek, auto otherwise)
    thinking_models: tuple[str, ...] = ()
    reasoning_replay: str = "auto"
    keep_upstream_id: bool = False
    response_model: str = "client"
    response_format: str | None = None  # pass | reject | drop; None = the dialect's default (proxy/hub/params.py)
    max_connections: int = 1000
    # Client dialects sent to this upstream untranslated (proxy/endpoint/passthrough.py): names its spoke serves
    # natively.
    passthrough: tuple[str, ...] = ()
    # The kinds of model this upstream serves (docs/retrieval.md): chat, embeddings, rerank. Parsed settings always
    # name them (by default, all its dialect serves: its mapping's paths); empty is chat alone.
    kinds: tuple[str, ...] = ()
    # TLS to the upstream (MindIE with httpsEnabled uses mutual TLS): CA bundle to verify the server, client
    # certificate and key to present; tls_verify false accepts any server certificate (testing only).
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_verify: bool = True
    # Gateway (docs/gateway.md): replicas of this upstream, failover, balancing, passive/active health, admission.
    replicas: tuple[ReplicaSettings, ...] = ()  # empty = one replica at `url` (with `health_url`)
    retries: int = 2
    balance: str = "least_outstanding"
    max_in_flight: int = 0  # per replica; 0 = unlimited
    queue_size: int = 0
    queue_timeout: float = 30.0
    outlier_failures: int = 3
    outlier_backoff: float = 5.0
    outlier_backoff_max: float = 300.0
    health_interval: float = 10.0
    affinity_load: float = 1.25
    affinity_turns: int = 1

    def replica_list(self) -> tuple[ReplicaSettings, ...]:
        return self.replicas or (ReplicaSettings("0", self.url, self.health_url),)


@dataclass(frozen=True, slots=True)
class ClientSettings:
    reasoning: str = "reasoning_content"
    usage_fields: str | None = None  # a dialect whose usage fields chat clients get too; None: OpenAI's alone
    # which of the two Responses specifications /v1/responses follows where they differ (docs/responses.md)
    responses_spec: str = "openai_api"
    # env var with the secret that signs Anthropic `thinking` blocks (proxy/clients/signature.py); none: a random
    # key per process, so signatures do not verify across workers, replicas or restarts (docs/messages.md)
    thinking_key_env: str | None = None
    thinking_key: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    log_level: str = "info"
    log_bodies: bool = False
    max_body_bytes: int = 4 * 1024 * 1024
    connect_timeout: float = 10.0
    first_byte_timeout: float = 600.0
    idle_timeout: float = 300.0
    total_timeout: float = 1800.0
    keepalive_interval: float = 15.0
    shutdown_grace: float = 30.0
    readiness_timeout: float = 2.0
    ready_when: str = "all"  # /readyz: every upstream up (a sidecar) or any (a gateway in front of several)
    api_keys_env: str | None = None  # env var with the comma-separated keys clients must send (none: open)
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    api_keys_file: str | None = None  # YAML mapping key name -> key (names go to the access log and `key` label)
    api_key_names: tuple[str, ...] = ()  # one per api_keys entry: the file's names, `env-1`, `env-2`, ... for env keys
    # The state store (proxy/state/): "memory" (per process) or a redis:// / rediss:// URL (may hold a password).
    state_store: str = field(default="memory", repr=False)
    state_max_entries: int = 10_000  # memory store bounds; the oldest entries go first
    state_max_bytes: int = 256 * 1024 * 1024
    state_ttl: float = 24 * 3600.0  # seconds each entry lives (memory and Redis)
    state_timeout: float = 2.0  # seconds to connect to / hear from Redis (an operation gives up after twice that)
    # The HTTP front end (proxy/server/frontend.py): request head size, time to receive a request, open connections.
    max_header_bytes: int = 65536
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    max_client_connections: int = 2048
    ws_idle_timeout: float = 600.0  # a WebSocket with no message either way for this long is closed
    ws_max_age: float = 3600.0  # a Responses WebSocket ends after this long (the Open Responses spec's 60 minutes)


@dataclass(frozen=True, slots=True)
class Settings:
    upstreams: tuple[UpstreamSettings, ...]
    client: ClientSettings = ClientSettings()
    server: ServerSettings = ServerSettings()
    # The environment's OTEL_* variables, as OpenTelemetry names them (proxy/metrics/tracing.py reads them; may hold a
    # collector's key in OTEL_EXPORTER_OTLP_HEADERS, so kept out of repr).
    otel: tuple[tuple[str, str], ...] = field(default=(), repr=False)


# ---------------------------------------------------------------------------------------------------------------
# Value coercion, shared by the YAML file, flags and environment variables.

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def coerce_value(key: str, value: Any, kind: type, choices: tuple[str, ...] | None = None) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise ConfigError(f"{key}: expected a boolean (true/false, 1/0, yes/no), got {value!r}")
    if kind is int or kind is float:
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
    if kind is str:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{key}: expected a non-empty string, got {value!r}")
        if choices and value not in choices:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(choices)}")
        return value
    raise AssertionError(kind)


def _str_list(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{key}: expected a list of strings, got {value!r}")
    return tuple(value)


def _positive(key: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"{key}: must be greater than 0, got {value!r}")


_SERVER_KINDS: dict[str, tuple[type, tuple[str, ...] | None]] = {
    "host": (str, None),
    "port": (int, None),
    "workers": (int, None),
    "log_level": (str, LOG_LEVELS),
    "log_bodies": (bool, None),
    "max_body_bytes": (int, None),
    "connect_timeout": (float, None),
    "first_byte_timeout": (float, None),
    "idle_timeout": (float, None),
    "total_timeout": (float, None),
    "keepalive_interval": (float, None),
    "shutdown_grace": (float, None),
    "readiness_timeout": (float, None),
    "api_keys_env": (str, None),
    "api_keys_file": (str, None),
    "ready_when": (str, ("all", "any")),
    "state_store": (str, None),
    "state_max_entries": (int, None),
    "state_max_bytes": (int, None),
    "state_ttl": (float, None),
    "state_timeout": (float, None),
    "max_header_bytes": (int, None),
    "header_timeout": (float, None),
    "body_timeout": (float, None),
    "max_client_connections": (int, None),
    "ws_idle_timeout": (float, None),
    "ws_max_age": (float, None),
}
_CLIENT_KINDS: dict[str, tuple[type, tuple[str, ...] | None]] = {
    "reasoning": (str, CLIENT_REASONING),
    "usage_fields": (str, None),  # one of usage_field_names(), checked in build_settings
    "responses_spec": (str, RESPONSES_SPECS),
    "thinking_key_env": (str, None),
}
_UPSTREAM_KEYS = (
    "name", "dialect", "url", "models", "aliases", "full_text", "api_key_env", "health_url", "reasoning_source",
    "thinking_models", "reasoning_replay", "keep_upstream_id", "response_model", "response_format", "max_connections",
    "passthrough", "kinds",
    "tls_ca_file", "tls_cert_file", "tls_key_file", "tls_verify",
    "retries", "balance", "max_in_flight", "queue_size", "queue_timeout", "outlier_failures", "outlier_backoff",
    "outlier_backoff_max", "health_interval", "affinity_load", "affinity_turns",
)
_REPLICA_KEYS = ("url", "name", "health_url")
_LABEL = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_var_name(key: str, value: Any) -> str:
    """The name of an environment variable. A value that is no such name is most likely the secret itself, pasted
    where its variable's name belongs: the message says so and never shows it."""
    name: str = coerce_value(key, value, str)
    if not _ENV_NAME.fullmatch(name):
        raise ConfigError(f"{key}: expects the NAME of an environment variable (e.g. MINDIE_API_KEY), not the key "
                          f"itself; the value given ({len(name)} characters) is not shown")
    return name


def dialect_names() -> tuple[str, ...]:
    """The upstream dialects' names, from their spokes' registry (proxy/dialects/__init__.py: imported when first
    asked, as the spokes import this module's types)."""
    from proxy.dialects import DIALECTS

    return tuple(DIALECTS)


def usage_field_names() -> tuple[str, ...]:
    """The values of `client.usage_fields`: the dialects whose spokes offer their usage fields to chat clients."""
    from proxy.dialects import DIALECTS

    return tuple(name for name, spoke in DIALECTS.items() if spoke.offers_usage_fields)


def passthrough_names(key: str, value: Any, dialect: str) -> tuple[str, ...]:
    """`passthrough`: client dialect names (a list, or one string with commas), each one the dialect's spoke serves
    natively (its mapping's `native`); `true` names them all, `false` none."""
    from proxy.dialects import DIALECTS

    served = tuple(DIALECTS[dialect].native_routes())
    if value is None:
        return ()
    if value is True or value is False:
        return served if value else ()
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    names = _str_list(key, value)
    for name in names:
        if name not in served:
            which = ", ".join(served) if served else "none"
            raise ConfigError(f"{key}: {name!r} is not a client dialect the {dialect} dialect serves natively "
                              f"(it serves: {which})")
    return tuple(dict.fromkeys(names))


def model_kinds(key: str, value: Any, dialect: str) -> tuple[str, ...]:
    """`kinds`: the kinds of model an upstream serves (a list, or one string with commas), each one its dialect
    serves (a path for it in its mapping); none given: all of those."""
    from proxy.dialects.mapping import load_mapping

    paths = load_mapping(dialect).paths
    served = tuple(kind for kind in MODEL_KINDS if paths.get(kind))
    if value is None:
        return served
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    kinds = _str_list(key, value)
    for kind in kinds:
        if kind not in served:
            raise ConfigError(f"{key}: {kind!r} is not a kind of model the {dialect} dialect serves "
                              f"(it serves: {', '.join(served)})")
    if not kinds:
        raise ConfigError(f"{key}: name at least one of {', '.join(served)}")
    return tuple(dict.fromkeys(kinds))


def dialect_name(key: str, value: Any) -> str:
    """A dialect name, case-insensitive; a near miss gets a "did you mean"."""
    name: str = coerce_value(key, value, str).strip().lower()
    names = dialect_names()
    if name in names:
        return name
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(f"{key}: {value!r} is not one of {', '.join(names)}{hint}")


def _unknown(prefix: str, data: Mapping[str, Any], known: tuple[str, ...] | Mapping[str, Any]) -> None:
    for key in data:
        if key not in known:
            raise ConfigError(f"{prefix}{key}: unknown key (known keys: {', '.join(known)})")


def normalize_url(key: str, url: str) -> str:
    """Accept the server's base URL with or without a trailing `/v1` (users paste OpenAI-style base URLs)."""
    url = url.strip()
    if not (url.startswith("http://") or url.startswith("https://")):
        raise ConfigError(f"{key}: expected an http:// or https:// URL, got {url!r}")
    url = url.rstrip("/")
    url = url.removesuffix("/v1")
    return url


def build_upstream(prefix: str, data: Mapping[str, Any], environ: Mapping[str, str]) -> UpstreamSettings:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix.rstrip('.')}: expected a mapping, got {data!r}")
    _unknown(prefix, data, _UPSTREAM_KEYS)
    for required in ("dialect", "url"):
        if required not in data:
            raise ConfigError(f"{prefix}{required}: missing (required for every upstream)")
    dialect = dialect_name(prefix + "dialect", data["dialect"])
    health_url = _http_url(prefix + "health_url", data.get("health_url"))
    replicas = _replicas(prefix, data["url"], health_url)
    url = replicas[0].url
    if len(replicas) == 1:
        health_url = replicas[0].health_url
    name = coerce_value(prefix + "name", data.get("name", dialect), str)
    models = _str_list(prefix + "models", data.get("models", ["*"]))
    aliases_raw = data.get("aliases") or {}
    if not isinstance(aliases_raw, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and k and v for k, v in aliases_raw.items()
    ):
        raise ConfigError(f"{prefix}aliases: expected a mapping of client model name to upstream model name")
    api_key_env = data.get("api_key_env")
    api_key = None
    if api_key_env is not None:
        api_key_env = env_var_name(prefix + "api_key_env", api_key_env)
        api_key = environ.get(api_key_env)
        if not api_key:
            raise ConfigError(f"{prefix}api_key_env: environment variable {api_key_env} is not set")
    reasoning_source = data.get("reasoning_source")
    if reasoning_source is not None:
        reasoning_source = coerce_value(prefix + "reasoning_source", reasoning_source, str, REASONING_SOURCES)
    response_format = data.get("response_format")
    if response_format is not None:
        response_format = coerce_value(prefix + "response_format", response_format, str, RESPONSE_FORMAT)
    max_connections = coerce_value(prefix + "max_connections", data.get("max_connections", 1000), int)
    _positive(prefix + "max_connections", max_connections)
    tls: dict[str, str | None] = {}
    for key in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
        value = data.get(key)
        if value is not None:
            value = coerce_value(prefix + key, value, str)
            if not os.path.isfile(value):
                raise ConfigError(f"{prefix}{key}: no such file: {value}")
        tls[key] = value
    if bool(tls["tls_cert_file"]) != bool(tls["tls_key_file"]):
        raise ConfigError(f"{prefix}tls_cert_file: a client certificate needs both tls_cert_file and tls_key_file")
    try:  # load them now: a bad file stops start-up, not the first request
        ctx = ssl.create_default_context(cafile=tls["tls_ca_file"])
        if tls["tls_cert_file"] and tls["tls_key_file"]:
            ctx.load_cert_chain(tls["tls_cert_file"], tls["tls_key_file"])
    except (ssl.SSLError, OSError, ValueError) as e:
        which = "tls_cert_file" if tls["tls_cert_file"] else "tls_ca_file"
        raise ConfigError(f"{prefix}{which}: cannot load the TLS files ({e})") from None
    return UpstreamSettings(
        name=name,
        dialect=dialect,
        url=url,
        models=models,
        aliases=dict(aliases_raw),
        full_text=coerce_value(prefix + "full_text", data.get("full_text", False), bool),
        api_key_env=api_key_env,
        api_key=api_key,
        health_url=health_url,
        reasoning_source=reasoning_source,
        thinking_models=_str_list(prefix + "thinking_models", data.get("thinking_models", [])),
        reasoning_replay=coerce_value(
            prefix + "reasoning_replay", data.get("reasoning_replay", "auto"), str, REASONING_REPLAY
        ),
        keep_upstream_id=coerce_value(prefix + "keep_upstream_id", data.get("keep_upstream_id", False), bool),
        response_model=coerce_value(
            prefix + "response_model", data.get("response_model", "client"), str, RESPONSE_MODEL
        ),
        response_format=response_format,
        max_connections=max_connections,
        passthrough=passthrough_names(prefix + "passthrough", data.get("passthrough"), dialect),
        kinds=model_kinds(prefix + "kinds", data.get("kinds"), dialect),
        tls_ca_file=tls["tls_ca_file"],
        tls_cert_file=tls["tls_cert_file"],
        tls_key_file=tls["tls_key_file"],
        tls_verify=coerce_value(prefix + "tls_verify", data.get("tls_verify", True), bool),
        replicas=replicas,
        **_gateway(prefix, data),
    )


def _http_url(key: str, value: Any) -> str | None:
    if value is None:
        return None
    url: str = coerce_value(key, value, str)
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"{key}: expected an http:// or https:// URL, got {url!r}")
    return url


def _replicas(prefix: str, raw: Any, health_url: str | None) -> tuple[ReplicaSettings, ...]:
    """`url`: one URL, several separated by commas, or a list of URLs or of {url, name, health_url} mappings."""
    key = prefix + "url"
    listed = isinstance(raw, list)
    if isinstance(raw, str):
        raw = [part for part in raw.split(",") if part.strip()]
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{key}: expected a URL or a list of replica URLs, got {raw!r}")
    out: list[ReplicaSettings] = []
    for i, item in enumerate(raw):
        where = f"{key}[{i}]" if listed or len(raw) > 1 else key
        if isinstance(item, Mapping):
            _unknown(where + ".", item, _REPLICA_KEYS)
            if "url" not in item:
                raise ConfigError(f"{where}.url: missing (required for every replica)")
            name = coerce_value(where + ".name", item.get("name", str(i)), str)
            if not _LABEL.fullmatch(name):
                raise ConfigError(f"{where}.name: {name!r} must be 1-64 letters, digits, '_', '.' or '-' "
                                  "(it is a metrics label)")
            url = normalize_url(where + ".url", coerce_value(where + ".url", item["url"], str))
            out.append(ReplicaSettings(name, url, _http_url(where + ".health_url", item.get("health_url"))))
        else:
            url = normalize_url(where, coerce_value(where, item, str))
            out.append(ReplicaSettings(str(i), url, None))
    names = [r.name for r in out]
    for i, n in enumerate(names):
        if names.index(n) != i:
            raise ConfigError(f"{key}[{i}].name: {n!r} is used twice (give each replica its own name)")
    if health_url is not None:
        if len(out) > 1:
            raise ConfigError(f"{prefix}health_url: with several replicas, give each its own health_url "
                              "(url: [{url: ..., health_url: ...}, ...])")
        out[0] = ReplicaSettings(out[0].name, out[0].url, health_url)
    return tuple(out)


_GATEWAY_KINDS: dict[str, tuple[type, Any, float | None]] = {  # key: (type, default, lowest allowed)
    "retries": (int, 2, 0),
    "balance": (str, "least_outstanding", None),
    "max_in_flight": (int, 0, 0),
    "queue_size": (int, 0, 0),
    "queue_timeout": (float, 30.0, 0),
    "outlier_failures": (int, 3, 0),
    "outlier_backoff": (float, 5.0, 0.001),
    "outlier_backoff_max": (float, 300.0, 0.001),
    "health_interval": (float, 10.0, 0),
    "affinity_load": (float, 1.25, 1.0),
    "affinity_turns": (int, 1, 0),
}


def _gateway(prefix: str, data: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, (kind, default, lowest) in _GATEWAY_KINDS.items():
        value = coerce_value(prefix + key, data.get(key, default), kind, BALANCE if key == "balance" else None)
        if lowest is not None and value < lowest:
            raise ConfigError(f"{prefix}{key}: must be at least {lowest:g}, got {value!r}")
        out[key] = value
    if out["queue_size"] and not out["max_in_flight"]:
        raise ConfigError(f"{prefix}queue_size: a queue needs max_in_flight (the queue holds what is over it)")
    return out


def load_api_keys_file(path: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """`api_keys_file`: a YAML mapping of key name -> key. Returns (names, keys). Never shows a key."""
    key = "server.api_keys_file"
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"{key}: {path}: {e.strerror or e}") from None
    except yaml.YAMLError:
        raise ConfigError(f"{key}: {path} is not valid YAML (expected a mapping of key name to key)") from None
    if not isinstance(data, Mapping) or not data:
        raise ConfigError(f"{key}: {path} must be a non-empty mapping of key name to key")
    names: list[str] = []
    keys: list[str] = []
    for name, value in data.items():
        if not isinstance(name, str) or not _LABEL.fullmatch(name):
            raise ConfigError(f"{key}: key name {name!r} must be 1-64 letters, digits, '_', '.' or '-' "
                              "(it is a metrics label)")
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{key}: the key named {name!r} must be a non-empty string")
        names.append(name)
        keys.append(value.strip())
    return tuple(names), tuple(keys)


_SECRET_PARAMS = ("password", "username", "sentinel_password", "sentinel_username")


def redact_url(url: str) -> str:
    """The URL with its user info and password parameters replaced by ***: fit for logs, errors and /readyz.
    Works on the string (not urlsplit), so that an unescaped '/', '#' or '?' in a password cannot slip through."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "***" if "@" in url else url
    if "@" in rest:
        rest = "***@" + rest.rpartition("@")[2]
    base, q, query = rest.partition("?")
    if q:
        pairs = [p.partition("=") for p in query.split("&")]
        query = "&".join(k + e + ("***" if k.lower() in _SECRET_PARAMS else v) for k, e, v in pairs)
    return scheme + sep + base + q + query


def url_secrets(url: str) -> tuple[str, ...]:
    """The credentials a URL carries (raw and unquoted), to scrub from any text that might echo them."""
    rest = url.partition("://")[2]
    userinfo = rest.rpartition("@")[0]
    found = [userinfo, userinfo.partition(":")[2]]
    found += [v for k, _, v in (p.partition("=") for p in rest.partition("?")[2].split("&"))
              if k.lower() in _SECRET_PARAMS]
    return tuple(s for f in found if f for s in {f, unquote(f)})


def state_store_value(key: str, value: str) -> str:
    """`memory`, or a Redis URL (proxy/state/urls.py: one server, Sentinel or Cluster) with hosts, valid ports and
    an optional /DB number. Messages show the URL without its credentials."""
    from proxy.state.urls import parse_store_url  # proxy.state imports this module

    if value.strip().lower() == "memory":
        return "memory"
    url = value.strip()
    try:
        parse_store_url(url, redact_url(url))
    except ValueError as e:
        raise ConfigError(f"{key}: {e}") from None
    return url


def load_config_file(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"config file {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"config file {path}: not valid YAML{where}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping at the top level")
    return data


def _section(data: Mapping[str, Any], key: str, kinds: Mapping[str, Any]) -> dict[str, Any]:
    section = data.get(key) or {}
    if not isinstance(section, Mapping):
        raise ConfigError(f"{key}: expected a mapping")
    _unknown(key + ".", section, tuple(kinds))
    return {k: coerce_value(f"{key}.{k}", v, *kinds[k]) for k, v in section.items()}


def build_settings(
    *,
    config: Mapping[str, Any] | None = None,
    server_overrides: Mapping[str, Any] | None = None,
    client_overrides: Mapping[str, Any] | None = None,
    single_upstream: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Build settings from a parsed config mapping and/or override mappings (already merged flag > env).

    `single_upstream` is the `--upstream-url` form: one upstream that takes every model name.
    """
    environ = os.environ if environ is None else environ
    config = dict(config or {})
    _unknown("", config, ("upstreams", "client", "server"))
    server_values = _section(config, "server", _SERVER_KINDS)
    for k, v in (server_overrides or {}).items():
        if v is not None:
            server_values[k] = coerce_value(k.replace("_", "-"), v, *_SERVER_KINDS[k])
    client_kinds = {**_CLIENT_KINDS, "usage_fields": (str, usage_field_names())}
    client_values = _section(config, "client", client_kinds)
    for k, v in (client_overrides or {}).items():
        if v is not None:
            client_values[k] = coerce_value(k.replace("_", "-"), v, *client_kinds[k])
    keys_env = server_values.get("api_keys_env")
    if keys_env:
        keys_env = env_var_name("server.api_keys_env", keys_env)
        raw_keys = environ.get(keys_env, "")
        keys = tuple(k.strip() for k in raw_keys.split(",") if k.strip())
        if not keys:
            raise ConfigError(f"server.api_keys_env: environment variable {keys_env} is not set (or holds no key)")
        server_values["api_keys"] = keys
        server_values["api_key_names"] = tuple(f"env-{i + 1}" for i in range(len(keys)))
    keys_file = server_values.get("api_keys_file")
    if keys_file:
        names, file_keys = load_api_keys_file(keys_file)
        all_names = (*server_values.get("api_key_names", ()), *names)
        for i, n in enumerate(all_names):
            if all_names.index(n) != i:
                raise ConfigError(f"server.api_keys_file: the key name {n!r} is used twice")
        server_values["api_keys"] = (*server_values.get("api_keys", ()), *file_keys)
        server_values["api_key_names"] = all_names
    thinking_env = client_values.get("thinking_key_env")
    if thinking_env:
        thinking_env = env_var_name("client.thinking_key_env", thinking_env)
        if not environ.get(thinking_env):
            raise ConfigError(f"client.thinking_key_env: environment variable {thinking_env} is not set")
        client_values["thinking_key"] = environ[thinking_env]
    if "state_store" in server_values:
        server_values["state_store"] = state_store_value("server.state_store", server_values["state_store"])
    server = ServerSettings(**server_values)
    for key in ("connect_timeout", "first_byte_timeout", "idle_timeout", "total_timeout", "keepalive_interval",
                "readiness_timeout", "max_body_bytes", "workers", "state_max_entries", "state_max_bytes",
                "state_ttl", "state_timeout", "max_header_bytes", "header_timeout", "body_timeout",
                "max_client_connections", "ws_idle_timeout", "ws_max_age"):
        _positive(f"server.{key}", getattr(server, key))
    if not 0 <= server.port <= 65535:
        raise ConfigError(f"server.port: {server.port} is not a TCP port")
    if server.shutdown_grace < 0:
        raise ConfigError("server.shutdown_grace: must not be negative")

    if single_upstream is not None:
        if config.get("upstreams"):
            raise ConfigError("--upstream-url and a config file's upstreams cannot be used together")
        upstreams: tuple[UpstreamSettings, ...] = (build_upstream("upstream.", single_upstream, environ),)
    else:
        raw = config.get("upstreams")
        if not raw:
            raise ConfigError("upstreams: no upstream configured (give --upstream-url or a config file)")
        if not isinstance(raw, list):
            raise ConfigError("upstreams: expected a list of upstreams")
        upstreams = tuple(build_upstream(f"upstreams[{i}].", u, environ) for i, u in enumerate(raw))
    upstream_names = [u.name for u in upstreams]
    for i, n in enumerate(upstream_names):
        if upstream_names.index(n) != i:
            raise ConfigError(f"upstreams[{i}].name: {n!r} is used twice (give each upstream its own name)")
    otel = tuple(sorted((k, v) for k, v in environ.items() if k.startswith("OTEL_")))
    settings = Settings(upstreams=upstreams, client=ClientSettings(**client_values), server=server, otel=otel)
    if otel:
        from proxy.metrics.tracing import OtelConfig

        OtelConfig.parse(dict(otel))  # a mistake in them stops start-up here, with the variable's name
    return settings
