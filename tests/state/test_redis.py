"""RedisStore (proxy/state/redis.py) against a real redis-server: prefixed keys, TTL carried to Redis, and every
failure a bounded StoreUnavailable."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest
import redis

from proxy.state import StoreUnavailable
from proxy.state.redis import RedisStore
from tests.conftest import RedisServer, free_port

T = TypeVar("T")
GUARD = 30  # seconds: a test that hangs fails instead (the store's own bounds are far below)


def run(coro: Coroutine[Any, Any, T]) -> T:
    async def guarded() -> T:
        return await asyncio.wait_for(coro, GUARD)

    return asyncio.run(guarded())


@pytest.fixture
def logs() -> Iterator[list[str]]:
    """Lines the proxy logs (a handler on its own logger, whatever propagation is set to)."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("dialect_proxy")
    handler = Collect()
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    yield lines
    logger.removeHandler(handler)
    logger.setLevel(old)


def test_keys_are_prefixed_and_values_plain(redis_url: str, redis_server: RedisServer) -> None:
    async def main() -> None:
        store = RedisStore(redis_url)
        await store.put("responses", "resp_1", b"\x00body")
        await store.close()

    run(main())
    assert redis_server.command("KEYS", "*") == [b"dialect-proxy:responses:resp_1"]
    assert redis_server.command("GET", "dialect-proxy:responses:resp_1") == b"\x00body"


def test_ttl_is_carried_to_redis(redis_url: str, redis_server: RedisServer) -> None:
    async def main() -> None:
        store = RedisStore(redis_url, ttl=3600)
        await store.put("responses", "default", b"v")
        await store.put("responses", "own", b"v", ttl=90.5)
        await store.put("responses", "tiny", b"v", ttl=0.0001)  # rounds up to 1 ms, never to "no TTL"
        await store.close()

    run(main())
    default = redis_server.command("PTTL", "dialect-proxy:responses:default")
    own = redis_server.command("PTTL", "dialect-proxy:responses:own")
    assert 3_500_000 < default <= 3_600_000
    assert 89_000 < own <= 90_500
    assert redis_server.command("PTTL", "dialect-proxy:responses:tiny") in (-2, 0, 1)  # gone or about to go


def test_the_default_ttl_is_24_hours(redis_url: str, redis_server: RedisServer) -> None:
    async def main() -> None:
        store = RedisStore(redis_url)
        await store.put("reasoning", "call_1", b"v")
        await store.close()

    run(main())
    assert 86_300_000 < redis_server.command("PTTL", "dialect-proxy:reasoning:call_1") <= 86_400_000


def test_a_killed_server_is_store_unavailable(start_redis: Callable[..., RedisServer], logs: list[str]) -> None:
    srv = start_redis()

    async def main() -> None:
        store = RedisStore(srv.url, timeout=0.5)
        await store.put("responses", "k", b"v")
        srv.kill()
        for op in (store.get("responses", "k"), store.put("responses", "k", b"v"), store.delete("responses", "k"),
                   store.ping()):
            with pytest.raises(StoreUnavailable) as err:
                await op
            assert err.value.status == 503 and err.value.code == "state_store_unavailable"
            assert "redis" not in err.value.message.lower()  # no detail for the client
        await store.close()

    run(main())
    assert any('"state_store_error"' in line and f"127.0.0.1:{srv.port}" in line for line in logs)


def test_the_store_recovers_when_the_server_comes_back(start_redis: Callable[..., RedisServer]) -> None:
    srv = start_redis()

    async def main() -> None:
        store = RedisStore(srv.url, timeout=0.5)
        await store.put("responses", "before", b"v")
        srv.kill()
        with pytest.raises(StoreUnavailable):
            await store.get("responses", "before")
        srv.start()  # same port, empty (no persistence)
        assert await store.get("responses", "before") is None
        await store.put("responses", "after", b"v")
        assert await store.get("responses", "after") == b"v"
        await store.close()

    run(main())


def test_a_restart_between_operations_costs_no_error(start_redis: Callable[..., RedisServer]) -> None:
    """A pooled connection broken by a server restart is retried once on a new connection."""
    srv = start_redis()

    async def main() -> None:
        store = RedisStore(srv.url, timeout=0.5)
        await store.put("responses", "k", b"v")
        srv.stop()
        srv.start()
        await store.put("responses", "k", b"again")
        assert await store.get("responses", "k") == b"again"
        await store.close()

    run(main())


def test_nothing_listening_is_store_unavailable() -> None:
    port = free_port()  # bound once and released: nothing listens there

    async def main() -> None:
        store = RedisStore(f"redis://127.0.0.1:{port}/0", timeout=0.5)
        with pytest.raises(StoreUnavailable):
            await store.ping()
        with pytest.raises(StoreUnavailable):
            await store.get("responses", "k")
        await store.close()

    run(main())


def test_a_server_that_never_answers_is_store_unavailable_not_a_hang() -> None:
    """A socket that accepts connections and says nothing: the socket timeout ends each operation."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]

        async def main() -> None:
            store = RedisStore(f"redis://127.0.0.1:{port}/0", timeout=0.3)
            for _ in range(2):
                with pytest.raises(StoreUnavailable):
                    await store.put("responses", "k", b"v")
            await store.close()

        run(main())


def test_credentials_never_leave(start_redis: Callable[..., RedisServer], logs: list[str]) -> None:
    password = "s3cret-Pa55word"
    srv = start_redis("--requirepass", password)
    good = f"redis://:{password}@127.0.0.1:{srv.port}/0"
    bad = f"redis://default:wrong-{password}@127.0.0.1:{srv.port}/0"

    async def main() -> None:
        store = RedisStore(good)
        assert store.describe() == f"redis://***@127.0.0.1:{srv.port}/0"
        await store.put("responses", "k", b"v")
        assert await store.get("responses", "k") == b"v"
        await store.close()
        wrong = RedisStore(bad, timeout=0.5)
        with pytest.raises(StoreUnavailable) as err:
            await wrong.get("responses", "k")
        assert password not in err.value.message
        await wrong.close()

    run(main())
    assert srv.command("GET", "dialect-proxy:responses:k", password=password) == b"v"
    assert any("AuthenticationError" in line or "ResponseError" in line for line in logs)
    assert logs and not any(password in line for line in logs)


def test_db_number_from_the_url(redis_server: RedisServer, redis_url: str) -> None:
    async def main() -> None:
        store = RedisStore(f"redis://127.0.0.1:{redis_server.port}/3")
        await store.put("responses", "k", b"db3")
        await store.close()

    run(main())
    assert redis_server.command("KEYS", "*") == []  # db 0 untouched

    with redis.Redis(host="127.0.0.1", port=redis_server.port, db=3, socket_timeout=5) as client:
        assert client.get("dialect-proxy:responses:k") == b"db3"
        client.flushdb()
