"""RedisStore: the state store in a Redis (or Valkey) server, shared by every worker and replica that points at it.

Keys are `dialect-proxy:{namespace}:{key}`; every put carries a TTL (SET ... PX), so Redis expires entries by itself
and its own `maxmemory` policy bounds the memory. Every operation is bounded in time: connect and socket timeouts of
`timeout` seconds (server.state_timeout), one immediate retry on a broken connection (a restarted server), and a hard
cap of 2 x `timeout` on the whole operation. Any failure (refused, reset, timeout, authentication, an error reply)
becomes `StoreUnavailable` (503 service_unavailable); the client sees no Redis detail, the log gets one line with the
URL stripped of credentials.

The `redis` package (pip install 'dialect-proxy[redis]') is imported only when this store is built.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

import orjson

from ..settings import redact_url, url_secrets
from .base import StoreUnavailable, check_namespace
from .memory import DEFAULT_TTL

log = logging.getLogger("dialect_proxy")
KEY_PREFIX = "dialect-proxy"
T = TypeVar("T")


class RedisStore:
    def __init__(self, url: str, *, ttl: float = DEFAULT_TTL, timeout: float = 2.0, prefix: str = KEY_PREFIX) -> None:
        import redis.asyncio
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import RedisError

        self.ttl = ttl
        self.timeout = timeout
        self.prefix = prefix
        self._redacted = redact_url(url)
        self._secrets = url_secrets(url)
        self._errors: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)
        self._client: Any = redis.asyncio.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 1),
            health_check_interval=0)

    def describe(self) -> str:
        return self._redacted

    def key(self, namespace: str, key: str) -> str:
        check_namespace(namespace)
        return f"{self.prefix}:{namespace}:{key}"

    async def get(self, namespace: str, key: str) -> bytes | None:
        value = await self._call("GET", self._client.get(self.key(namespace, key)))
        return None if value is None else bytes(value)

    async def put(self, namespace: str, key: str, value: bytes, ttl: float | None = None) -> None:
        ttl = self.ttl if ttl is None else ttl
        if ttl <= 0:
            raise ValueError("ttl must be greater than 0")
        await self._call("SET", self._client.set(self.key(namespace, key), bytes(value), px=max(1, round(ttl * 1000))))

    async def delete(self, namespace: str, key: str) -> bool:
        return bool(await self._call("DEL", self._client.delete(self.key(namespace, key))))

    async def ping(self) -> None:
        await self._call("PING", self._client.ping())

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self._client.aclose(), self.timeout)
        except self._errors:
            pass

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    async def _call(self, command: str, op: Awaitable[T]) -> T:
        try:
            async with asyncio.timeout(2 * self.timeout):
                return await op
        except self._errors as e:
            # redis-py's messages name host and port, never the password; the client gets none of it.
            line = {"event": "state_store_error", "store": self._redacted, "command": command,
                    "error": type(e).__name__, "detail": self._scrub(str(e))[:200]}
            log.warning(orjson.dumps(line).decode())
            raise StoreUnavailable() from None
