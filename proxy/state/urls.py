"""The Redis state store's URL forms (server.state_store), read once here for settings.py's check and for
proxy/state/redis.py's client:

    redis://[user:password@]host[:6379][/db]                         one server (rediss:// with TLS)
    redis+sentinel://[user:password@]host[:26379][,host[:26379]...]/service_name[/db]
                                                                     the master that Sentinel names (rediss+sentinel://)
    redis+cluster://[user:password@]host[:6379][,host[:6379]...]     a Redis Cluster from its seed nodes (rediss+cluster://)

Query parameters: `wait_replicas=N` (every put waits until N replicas hold it, else the request that stored it gets a
503: docs/decisions.md "Operations", state that survives a failover; the default is 1 for Sentinel, 0 otherwise; not for
Cluster), and for Sentinel `sentinel_username` / `sentinel_password` (the Sentinels' own credentials; the URL's user
and password are the Redis servers'). A plain redis:// URL keeps redis-py's own query parameters too.

Hosts and user info are split as urllib (and redis-py) split them: the host list ends at the first '/'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import SplitResult, parse_qsl, unquote, urlencode, urlsplit

__all__ = ["SCHEMES", "StoreURL", "parse_store_url"]

SCHEMES = ("redis", "rediss", "redis+sentinel", "rediss+sentinel", "redis+cluster", "rediss+cluster")
_OURS = ("wait_replicas", "sentinel_username", "sentinel_password")
_DEFAULT_PORT = {"redis": 6379, "sentinel": 26379, "cluster": 6379}


@dataclass(frozen=True)
class StoreURL:
    kind: str  # "redis", "sentinel" or "cluster"
    tls: bool
    url: str  # for "redis": the URL as redis-py reads it (our own query parameters removed)
    hosts: tuple[tuple[str, int], ...] = ()
    db: int = 0
    service: str = ""
    wait_replicas: int = 0
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    sentinel_username: str | None = field(default=None, repr=False)
    sentinel_password: str | None = field(default=None, repr=False)


def parse_store_url(url: str, shown: str) -> StoreURL:
    """Read a state store URL; `shown` is the URL without credentials, for the ValueError's message."""
    parts, scheme = _split(url, shown)
    kind = scheme.partition("+")[2] or "redis"
    ours, rest = _query(parts.query, kind, shown)
    wait = _wait_replicas(ours.get("wait_replicas"), kind, shown)
    hosts = _hosts(parts.netloc.rpartition("@")[2], _DEFAULT_PORT[kind], shown, several=kind != "redis")
    service, db = _path(parts.path, kind, shown)
    plain = "" if kind != "redis" else parts._replace(query=urlencode(rest)).geturl() if ours else url
    return StoreURL(kind=kind, tls=scheme.startswith("rediss"), url=plain, hosts=hosts, db=db, service=service,
                    wait_replicas=wait, username=unquote(parts.username) if parts.username else None,
                    password=unquote(parts.password) if parts.password is not None else None,
                    sentinel_username=ours.get("sentinel_username") or None,
                    sentinel_password=ours.get("sentinel_password") or None)


def _split(url: str, shown: str) -> tuple[SplitResult, str]:
    """The URL's parts and its (lower-case) scheme, one of SCHEMES."""
    # The host list is read apart (`_hosts`, one host at a time): urlsplit refuses a netloc of several hosts with an
    # IPv6 one among them (`s1,[::1]:26380`) on Pythons that check brackets (3.11.4+, Debian's backport).
    netloc = url.partition("://")[2]
    for end in "/?#":
        netloc = netloc.partition(end)[0]
    try:
        parts = urlsplit(url.replace(netloc, "host", 1) if netloc else url)._replace(netloc=netloc)
    except ValueError:
        raise ValueError(f"{shown!r} is not a valid URL (bad host or port)") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ValueError(f"expected memory or a redis://, rediss://, redis+sentinel:// or redis+cluster:// URL, "
                         f"got {shown!r}")
    return parts, scheme


def _query(query: str, kind: str, shown: str) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """Our own query parameters, and the rest (redis-py's: a plain redis:// URL only)."""
    pairs = parse_qsl(query, keep_blank_values=True)
    ours = {k: v for k, v in pairs if k in _OURS}
    rest = [(k, v) for k, v in pairs if k not in _OURS]
    if kind != "redis" and rest:
        raise ValueError(f"{shown!r}: unknown query parameter {rest[0][0]!r} (known: {', '.join(_OURS)})")
    if kind != "sentinel" and ("sentinel_username" in ours or "sentinel_password" in ours):
        raise ValueError(f"{shown!r}: sentinel_username and sentinel_password go with redis+sentinel://")
    return ours, rest


def _path(text: str, kind: str, shown: str) -> tuple[str, int]:
    """(the Sentinel service name, the database number) from the URL's path."""
    path = [p for p in text.split("/") if p]
    service = ""
    if kind == "sentinel":
        if not path:
            raise ValueError(f"{shown!r}: the path is the Sentinel service name (e.g. /mymaster), got none")
        service = unquote(path.pop(0))
    db_text = path.pop(0) if path else ""
    if path or (db_text and not db_text.isdigit()):
        raise ValueError(f"{shown!r}: the path is the database number (e.g. /0), got {text.strip('/')!r}")
    db = int(db_text or 0)
    if kind == "cluster" and db:
        raise ValueError(f"{shown!r}: a Redis Cluster has database 0 only")
    return service, db


def _wait_replicas(text: str | None, kind: str, shown: str) -> int:
    if text is None:
        return 1 if kind == "sentinel" else 0
    if kind == "cluster":
        # WAIT must follow the SET on the same connection to the key's node; redis-py's cluster client cannot
        # promise that, so a Cluster URL does not offer it (docs/decisions.md).
        raise ValueError(f"{shown!r}: wait_replicas is not available with redis+cluster:// (use redis+sentinel://)")
    if not text.isdigit():
        raise ValueError(f"{shown!r}: wait_replicas must be a whole number of replicas, got {text!r}")
    return int(text)


def _hosts(netloc: str, default_port: int, shown: str, several: bool) -> tuple[tuple[str, int], ...]:
    found: list[tuple[str, int]] = []
    for item in netloc.split(",") if several else [netloc]:
        try:
            one = urlsplit("//" + item)
            host, port = one.hostname, one.port
        except ValueError:
            raise ValueError(f"{shown!r} is not a valid URL (bad host or port)") from None
        if not host:
            raise ValueError(f"{shown!r} names no host (e.g. redis://redis:6379/0)")
        if port == 0:
            raise ValueError(f"{shown!r}: port 0 is not a TCP port")
        found.append((host, port or default_port))
    return tuple(found)
