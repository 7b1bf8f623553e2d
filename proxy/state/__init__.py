"""State stores (proxy/state/base.py): `open_store(settings)` builds the configured one, memory or Redis (Sentinel,
Cluster: urls.py). What must survive a restart or another replica: stored Responses, reasoning continuity.

May import: proxy.errors, proxy.settings. Nothing of the request path: the stores hold bytes under keys.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson

from proxy.settings import ConfigError, Settings
from proxy.state.base import StateStore, StoreUnavailable, ValueTooLarge
from proxy.state.memory import MemoryStore

log = logging.getLogger("dialect_proxy")


def open_store(settings: Settings) -> StateStore:
    s = settings.server
    if s.state_store == "memory":
        return MemoryStore(s.state_max_entries, s.state_max_bytes, s.state_ttl)
    try:
        from proxy.state.redis import RedisStore

        return RedisStore(s.state_store, ttl=s.state_ttl, timeout=s.state_timeout)
    except ImportError:
        raise ConfigError("server.state_store: a Redis store needs the redis package "
                          "(pip install 'dialect-proxy[redis]')") from None


def check_scale_out(settings: Settings) -> None:
    """Refuse a memory store shared by nothing: with `--workers` > 1 every worker would have its own, and a
    `previous_response_id` follow-up that lands on another worker would be refused as unknown (docs/decisions.md)."""
    s = settings.server
    if s.state_store == "memory" and s.workers > 1:
        raise ConfigError(f"server.state_store: memory is per process, so with --workers {s.workers} a follow-up "
                          "request on another worker finds nothing; use --state-store redis://HOST:6379/0 (shared by "
                          "every worker and replica) or --workers 1")


async def store_check(store: StateStore, timeout: float | None = None) -> dict[str, Any]:
    """For /readyz and the start-up log: which store, and whether it answers (within `timeout` seconds, /readyz's
    readiness_timeout, so that a silent Redis cannot make the readiness probe itself time out)."""
    try:
        await asyncio.wait_for(store.ping(), timeout)
    except StoreUnavailable as e:
        return {"store": store.describe(), "reachable": False, "detail": e.message}
    except TimeoutError:
        return {"store": store.describe(), "reachable": False, "detail": f"no answer within {timeout:g} s"}
    return {"store": store.describe(), "reachable": True}


async def log_store(store: StateStore, settings: Settings) -> None:
    """At start-up: one line saying which store is in use (credentials redacted) and whether it answers."""
    line: dict[str, Any] = {"event": "state_store", **await store_check(store), "ttl": settings.server.state_ttl}
    if isinstance(store, MemoryStore):
        line.update(max_entries=store.max_entries, max_bytes=store.max_bytes)
    (log.info if line["reachable"] else log.warning)(orjson.dumps(line).decode())


__all__ = ["MemoryStore", "StateStore", "StoreUnavailable", "ValueTooLarge", "check_scale_out", "log_store",
           "open_store", "store_check"]
