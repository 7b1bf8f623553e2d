"""RedisStore: the state store in a Redis (or Valkey) server, shared by every worker and replica that points at it.

Keys are `dialect-proxy:{namespace}:{key}`; every put carries a TTL (SET ... PX), so Redis expires entries by itself
and its own `maxmemory` policy bounds the memory. Every operation is bounded in time: connect and socket timeouts of
`timeout` seconds (server.state_timeout), one immediate retry on a broken connection (a restarted server), and a hard
cap of 2 x `timeout` on the whole operation. Any failure (refused, reset, timeout, authentication, an error reply)
becomes `StoreUnavailable` (503 service_unavailable); the client sees no Redis detail, the log gets one line with the
URL stripped of credentials.

Sentinel and Cluster (proxy/state/urls.py has the URL forms): `redis+sentinel://` asks the Sentinels for the master
and finds the new one after a failover; `redis+cluster://` routes each key to its node. With `wait_replicas=N` (the
default is 1 for Sentinel) a put returns only once N replicas acknowledged it (SET then WAIT on one connection): a
stored response that the client was told about survives the master's loss, and a put the replicas did not confirm
in time is a StoreUnavailable (503), never an answer whose state may vanish (docs/decisions.md).

The `redis` package (pip install 'dialect-proxy[redis]') is imported only when this store is built.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

import orjson

from proxy.settings import redact_url, url_secrets
from proxy.state.base import StoreUnavailable, check_namespace
from proxy.state.memory import DEFAULT_TTL
from proxy.state.urls import parse_store_url

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
        where = parse_store_url(url, self._redacted)
        self.kind = where.kind
        self.wait_replicas = where.wait_replicas
        common: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout,
                                  "retry": Retry(NoBackoff(), 1)}
        if where.kind == "redis":
            self._client: Any = redis.asyncio.Redis.from_url(where.url, health_check_interval=0, **common)
            return
        auth: dict[str, Any] = {"username": where.username, "password": where.password, "ssl": where.tls}
        if where.kind == "sentinel":
            from redis.asyncio.sentinel import Sentinel

            sentinel_auth = {"username": where.sentinel_username, "password": where.sentinel_password,
                             "ssl": where.tls, "socket_timeout": timeout, "socket_connect_timeout": timeout}
            self._sentinel: Any = Sentinel(list(where.hosts), sentinel_kwargs=sentinel_auth)  # type: ignore[no-untyped-call]
            self._client = self._sentinel.master_for(where.service, db=where.db, **auth, **common)
        else:
            from redis.asyncio.cluster import ClusterNode, RedisCluster

            self._client = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in where.hosts],
                                        **auth, **common)

    def describe(self) -> str:
        return self._redacted

    @property
    def client(self) -> Any:
        """The redis-py client (its connection pool), for the limit counters (proxy/state/counters_redis.py)."""
        return self._client

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
        name, px = self.key(namespace, key), max(1, round(ttl * 1000))
        if not self.wait_replicas:
            await self._call("SET", self._client.set(name, bytes(value), px=px))
            return
        # WAIT counts the replicas that hold this connection's writes so far: one pipeline, one connection.
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.set(name, bytes(value), px=px)
            # half the socket timeout: WAIT's own "not enough replicas" answer arrives before the socket gives up
            pipe.execute_command("WAIT", self.wait_replicas, max(1, round(self.timeout * 500)))
            _, acked = await self._call("SET+WAIT", pipe.execute())
        if acked < self.wait_replicas:
            self._log("SET+WAIT", "NotReplicated", f"{acked} of {self.wait_replicas} replicas acknowledged")
            raise StoreUnavailable()

    async def delete(self, namespace: str, key: str) -> bool:
        return bool(await self._call("DEL", self._client.delete(self.key(namespace, key))))

    async def ping(self) -> None:
        await self._call("PING", self._client.ping())

    async def close(self) -> None:
        clients = [self._client, *(self._sentinel.sentinels if self.kind == "sentinel" else ())]
        for client in clients:
            try:
                await asyncio.wait_for(client.aclose(), self.timeout)
            except self._errors:
                pass

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    async def call(self, command: str, op: Awaitable[T]) -> T:
        """`op` within the store's deadline; any failure a StoreUnavailable (logged, the password scrubbed)."""
        return await self._call(command, op)

    async def _call(self, command: str, op: Awaitable[T]) -> T:
        try:
            async with asyncio.timeout(2 * self.timeout):
                return await op
        except self._errors as e:
            # redis-py's messages name host and port, never the password; the client gets none of it.
            self._log(command, type(e).__name__, str(e))
            raise StoreUnavailable() from None

    def _log(self, command: str, error: str, detail: str) -> None:
        line = {"event": "state_store_error", "store": self._redacted, "command": command, "error": error,
                "detail": self._scrub(detail)[:200]}
        log.warning(orjson.dumps(line).decode())
