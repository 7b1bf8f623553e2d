"""Named inbound API keys and what each may do: the `api_keys_file` (and `api_keys_env`) read into one typed record
per key (`KeyPolicy`), held by a `KeyRing` that the key check (proxy/server/asgi.py) asks and that reads the file
again when it changes or on SIGHUP, without a restart (docs/sharing.md).

An entry of the file is either `name: key`, or a mapping:

    team-a:
      key: sk-...                  # or key_sha256: <hex of the key's SHA-256>
      models: ["DeepSeek-R1", "bge-*"]
      requests_per_minute: 60
      tokens_per_minute: 200000
      max_concurrent: 8
      tokens_per_day: 5000000      # quotas, counted in UTC days and months
      tokens_per_month: 100000000
      expires: 2027-01-31          # the last day the key works (UTC)
      weight: 2                    # its share when replicas are contended (proxy/gateway/admission.py)
    default:                       # what a key that does not say gets (no `key`)
      requests_per_minute: 30

A field left out is no limit. Keys are held by their SHA-256 only: a presented key is hashed and looked up, so the
lookup's time says nothing of the keys held, and a file may carry hashes alone.
"""

from __future__ import annotations

import dataclasses
import datetime
import fnmatch
import hashlib
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

import yaml

from proxy.errors import ProxyError
from proxy.settings import ConfigError

log: Final = logging.getLogger("dialect_proxy")
DEFAULT_ENTRY: Final = "default"
_LIMITS: Final = ("requests_per_minute", "tokens_per_minute", "max_concurrent", "tokens_per_day", "tokens_per_month")
_FIELDS: Final = frozenset({"key", "key_sha256", "models", "expires", "weight", *_LIMITS})
REMOTE_TTL: Final = 0.5  # seconds a key read from the Redis key store is kept (a revoked key is refused within 1 s)
_REMOTE_CACHE_MAX: Final = 10_000
_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


@dataclass(frozen=True, slots=True)
class KeyPolicy:
    """One key's policy; 0 (or None for `models` and `expires`) is no limit."""

    name: str
    models: tuple[str, ...] | None = None  # globs of the model names the key may use
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    max_concurrent: int = 0
    tokens_per_day: int = 0
    tokens_per_month: int = 0
    expires: datetime.date | None = None  # the last UTC day the key works
    weight: float = 1.0

    @property
    def limited(self) -> bool:
        """Whether any counted limit applies (then every answer carries the rate-limit headers)."""
        return any(getattr(self, f) for f in _LIMITS)

    def allows(self, model: str) -> bool:
        return self.models is None or any(fnmatch.fnmatchcase(model, pattern) for pattern in self.models)

    def expired(self, today: datetime.date) -> bool:
        return self.expires is not None and today > self.expires


def digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


@dataclass(frozen=True, slots=True)
class KeyFile:
    """A key file as read: each key's digest -> its policy, and the `default:` entry's fields."""

    policies: dict[bytes, KeyPolicy]
    default: KeyPolicy


def read_key_file(path: str, env_keys: tuple[str, ...] = (), where: str = "server.api_keys_file") -> KeyFile:
    """The file's keys (and the `api_keys_env` ones, named env-1, env-2 ..., under `default:`). A ConfigError names
    the entry and field that is wrong, never a key."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"{where}: {path}: {e.strerror or e}") from None
    except yaml.YAMLError:
        raise ConfigError(f"{where}: {path} is not valid YAML") from None
    if not isinstance(data, Mapping) or not data:
        raise ConfigError(f"{where}: {path} must be a non-empty mapping of key name to key (or to a policy)")
    default_entry = data.get(DEFAULT_ENTRY)
    default = _policy(f"{where}: {DEFAULT_ENTRY}", DEFAULT_ENTRY, default_entry or {}, None)[1]
    policies = env_policies(env_keys, default)
    for name, value in data.items():
        if name == DEFAULT_ENTRY:
            continue
        if not isinstance(name, str) or not name or len(name) > 64 or not set(name) <= _NAME_CHARS:
            raise ConfigError(f"{where}: key name {name!r} must be 1-64 letters, digits, '_', '.' or '-' "
                              "(it is a metrics label)")
        key_digest, policy = _policy(f"{where}: {name}", name, value, default)
        if key_digest is None:
            raise ConfigError(f"{where}: {name}: give `key` or `key_sha256`")
        if key_digest in policies:
            raise ConfigError(f"{where}: {name}: the same key is listed twice")
        policies[key_digest] = policy
    return KeyFile(policies, default)


def env_policies(env_keys: tuple[str, ...], default: KeyPolicy) -> dict[bytes, KeyPolicy]:
    return {digest(k): dataclasses.replace(default, name=f"env-{i + 1}") for i, k in enumerate(env_keys)}


def _policy(where: str, name: str, value: Any, default: KeyPolicy | None) -> tuple[bytes | None, KeyPolicy]:
    if isinstance(value, str):
        if not value.strip():
            raise ConfigError(f"{where}: the key must be a non-empty string")
        base = default or KeyPolicy(name)
        return digest(value.strip()), dataclasses.replace(base, name=name)
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a key (a string) or a mapping of its policy")
    unknown = sorted(str(k) for k in value if k not in _FIELDS)
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(_FIELDS))})")
    fields: dict[str, Any] = {} if default is None else {
        f.name: getattr(default, f.name) for f in dataclasses.fields(KeyPolicy) if f.name != "name"}
    for limit in _LIMITS:
        if limit in value:
            fields[limit] = _count(f"{where}.{limit}", value[limit])
    if "models" in value:
        fields["models"] = _models(f"{where}.models", value["models"])
    if "expires" in value:
        fields["expires"] = _date(f"{where}.expires", value["expires"])
    if "weight" in value:
        weight = value["weight"]
        if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
            raise ConfigError(f"{where}.weight: expected a number greater than 0")
        fields["weight"] = float(weight)
    return _key_digest(where, value), KeyPolicy(name, **fields)


def _key_digest(where: str, value: Mapping[str, Any]) -> bytes | None:
    if "key" in value and "key_sha256" in value:
        raise ConfigError(f"{where}: give `key` or `key_sha256`, not both")
    if "key" in value:
        key = value["key"]
        if not isinstance(key, str) or not key.strip():
            raise ConfigError(f"{where}.key: must be a non-empty string")
        return digest(key.strip())
    if "key_sha256" in value:
        hexed = value["key_sha256"]
        try:
            raw = bytes.fromhex(hexed) if isinstance(hexed, str) else b""
        except ValueError:
            raw = b""
        if len(raw) != 32:
            raise ConfigError(f"{where}.key_sha256: expected 64 hex digits (the SHA-256 of the key)")
        return raw
    return None


def _count(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}: expected a whole number of at least 0 (0 or left out: no limit)")
    return value


def _models(where: str, value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(m, str) and m for m in items):
        raise ConfigError(f"{where}: expected a list of model names (globs allowed: \"bge-*\")")
    return tuple(items)


def _date(where: str, value: Any) -> datetime.date:
    if isinstance(value, datetime.datetime):
        return value.date()
    if isinstance(value, datetime.date):
        return value
    try:
        return datetime.date.fromisoformat(str(value))
    except ValueError:
        raise ConfigError(f"{where}: expected a date, YYYY-MM-DD") from None


class RemoteKeys(Protocol):
    """The Redis key store (proxy/state/keystore.py `RedisKeyStore`)."""

    async def get(self, digest_hex: str) -> dict[str, Any] | None: ...


def stored_policy(fields: Mapping[str, Any], default: KeyPolicy) -> KeyPolicy | None:
    """A key store record (its `name` and the policy's fields) as a policy; None when it does not read."""
    name = fields.get("name")
    if not isinstance(name, str):
        return None
    try:
        return _policy(f"keys store: {name}", name, {k: v for k, v in fields.items() if k != "name"}, default)[1]
    except ConfigError as e:
        log.error("a key in the Redis key store does not read, refused: %s", e)
        return None


class KeyRing:
    """The keys a process accepts, by digest: the file's (and api_keys_env's), then the Redis key store's, each of
    those kept REMOTE_TTL seconds. `reload()` reads the file again; a file that no longer reads is logged and the
    keys held so far stay (a half-saved edit must not lock everyone out)."""

    def __init__(self, path: str | None, env_keys: tuple[str, ...] = (), remote: RemoteKeys | None = None) -> None:
        self.path = path
        self.env_keys = env_keys
        self.remote = remote
        self._mtime: float | None = None
        self.policies: dict[bytes, KeyPolicy] = {}
        self._by_name: dict[str, KeyPolicy] = {}
        self.default = KeyPolicy(DEFAULT_ENTRY)
        self._remote: dict[bytes, tuple[float, KeyPolicy | None]] = {}  # digest -> (kept until, policy)
        self._remote_names: dict[str, KeyPolicy] = {}
        if path is not None:
            self._mtime = _mtime(path)
            read = read_key_file(path, env_keys)
            self.default = read.default
            self._hold(read.policies)
        elif env_keys:
            self._hold(env_policies(env_keys, self.default))

    def _hold(self, policies: dict[bytes, KeyPolicy]) -> None:
        self.policies = policies
        self._by_name = {p.name: p for p in policies.values()}

    @property
    def active(self) -> bool:
        """Whether clients must send a key at all."""
        return bool(self.policies) or self.path is not None or self.remote is not None

    def names(self) -> list[str]:
        return sorted({p.name for p in self.policies.values()})

    async def identify(self, key: bytes) -> KeyPolicy | None:
        """The policy of the key a client sent, or None (unknown, or revoked from the key store)."""
        if not key:
            return None
        key_digest = digest(key)
        found = self.policies.get(key_digest)
        if found is not None or self.remote is None:
            return found
        now = time.monotonic()
        kept = self._remote.get(key_digest)
        if kept is not None and kept[0] > now:
            return kept[1]
        try:
            fields = await self.remote.get(key_digest.hex())
        except ProxyError:  # Redis down: a key seen lately stays known, an unknown one is refused
            return None if kept is None else kept[1]
        policy = None if fields is None else stored_policy(fields, self.default)
        if len(self._remote) >= _REMOTE_CACHE_MAX:
            self._remote.clear()
            self._remote_names.clear()
        self._remote[key_digest] = (now + REMOTE_TTL, policy)
        if policy is not None:
            self._remote_names[policy.name] = policy
        return policy

    def policy(self, name: str) -> KeyPolicy | None:
        """The policy of the key named `name` now (a reload may have changed it since the request came in)."""
        found = self._by_name.get(name)
        return found if found is not None else self._remote_names.get(name)

    def reload(self) -> bool:
        """Read the file again; True when the keys changed."""
        if self.path is None:
            return False
        self._mtime = _mtime(self.path)
        try:
            read = read_key_file(self.path, self.env_keys)
        except ConfigError as e:
            log.error("api_keys_file not reloaded, the keys read before stay: %s", e)
            return False
        policies = read.policies
        self.default = read.default
        changed = policies != self.policies
        self._hold(policies)
        if changed:
            log.info("api_keys_file reloaded: %d keys", len(policies))
        return changed

    def reload_if_changed(self) -> bool:
        """Read the file again when its modification time moved (polled once a second by the server)."""
        if self.path is None or _mtime(self.path) == self._mtime:
            return False
        return self.reload()


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime_ns / 1e9
    except OSError:
        return None
