"""The state store: what must outlive one request (stored Responses for `previous_response_id`, reasoning a client
dropped but an upstream needs back). Values are opaque bytes under a namespace and a key, each with a TTL.

Implementations: proxy.state.memory (the embedded default: bounded in entries and bytes, oldest first out) and
proxy.state.redis (shared by several replicas). A store that cannot be reached raises `StoreUnavailable` (a 503 for
the requests that need it, DECISIONS.md "Client dialects and state"); requests that need no state never touch it.
"""

from __future__ import annotations

from typing import Protocol

from ..errors import ProxyError


class StoreUnavailable(ProxyError):
    status = 503

    def __init__(self, message: str = "The state store cannot be reached.") -> None:
        super().__init__(message, 503, type="service_unavailable", code="state_store_unavailable")


class StateStore(Protocol):
    async def get(self, namespace: str, key: str) -> bytes | None:
        """The value, or None when unknown, deleted or expired."""

    async def put(self, namespace: str, key: str, value: bytes, ttl: float | None = None) -> None:
        """Store (replace) a value; `ttl` seconds (None = the store's default TTL)."""

    async def delete(self, namespace: str, key: str) -> bool:
        """True when something was deleted."""

    async def close(self) -> None: ...
