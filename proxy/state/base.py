"""The state store: what must outlive one request (stored Responses for `previous_response_id`, reasoning a client
dropped but an upstream needs back). Values are opaque bytes under a namespace and a key, each with a TTL.

Implementations: proxy.state.memory (the embedded default: bounded in entries and bytes, oldest first out; one per
process) and proxy.state.redis (shared by several workers and replicas). A store that cannot be reached raises
`StoreUnavailable` (a 503 for the requests that need it, docs/decisions.md "Client dialects and state"); requests
that need no state never touch it. `proxy.state.open_store(settings)` builds the configured one.
"""

from __future__ import annotations

from typing import Protocol

from proxy.errors import ProxyError


class StoreUnavailable(ProxyError):
    status = 503

    def __init__(self, message: str = "The state store cannot be reached.", code: str = "state_store_unavailable"
                 ) -> None:
        super().__init__(message, 503, type="service_unavailable", code=code)


class ValueTooLarge(StoreUnavailable):
    """One value bigger than the whole store may hold (server.state_max_bytes): refused rather than lost silently."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"The state store cannot keep a value of {size} bytes (server.state_max_bytes is {limit}).",
                         code="state_store_full")


def check_namespace(namespace: str) -> None:
    """Namespaces are short fixed names (`responses`, `reasoning`); no ':' so that `{namespace}:{key}` is unique."""
    if not namespace or ":" in namespace:
        raise ValueError(f"state store namespace {namespace!r}: must be non-empty and without ':'")


class StateStore(Protocol):
    """Every method takes a namespace (see check_namespace) and a key (any string)."""

    async def get(self, namespace: str, key: str) -> bytes | None:
        """The value, or None when unknown, deleted or expired."""

    async def put(self, namespace: str, key: str, value: bytes, ttl: float | None = None) -> None:
        """Store (replace) a value; `ttl` seconds (None = the store's default TTL)."""

    async def delete(self, namespace: str, key: str) -> bool:
        """True when something was deleted."""

    async def ping(self) -> None:
        """Return when the store answers; raise StoreUnavailable when it does not (bounded in time)."""

    def describe(self) -> str:
        """What the store is, for logs and /readyz (`memory`, or the Redis URL without credentials)."""

    async def close(self) -> None: ...
