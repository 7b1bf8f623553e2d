"""The StateStore contract (proxy/state/base.py), run against both stores: memory and a real redis-server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from proxy.state import MemoryStore, StateStore

Scenario = Callable[[StateStore], Awaitable[None]]


@pytest.fixture(params=["memory", "redis"])
def run(request: pytest.FixtureRequest) -> Callable[..., None]:
    """run(scenario, **store_options): build the store inside a fresh event loop, run the scenario, close it."""
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None

    def runner(scenario: Scenario, **options: Any) -> None:
        async def main() -> None:
            if url is None:
                store: StateStore = MemoryStore(**options)
            else:
                from proxy.state.redis import RedisStore

                store = RedisStore(url, **options)
            try:
                await asyncio.wait_for(scenario(store), 30)
            finally:
                await store.close()

        asyncio.run(main())

    return runner


def test_put_get_exact_bytes(run: Callable[..., None]) -> None:
    blob = bytes(range(256)) * 3 + b"\x00\xff tail"

    async def scenario(store: StateStore) -> None:
        assert await store.get("responses", "resp_1") is None
        await store.put("responses", "resp_1", blob)
        assert await store.get("responses", "resp_1") == blob
        await store.put("responses", "resp_2", b"")
        assert await store.get("responses", "resp_2") == b""

    run(scenario)


def test_put_replaces(run: Callable[..., None]) -> None:
    async def scenario(store: StateStore) -> None:
        await store.put("responses", "k", b"one")
        await store.put("responses", "k", b"two")
        assert await store.get("responses", "k") == b"two"

    run(scenario)


def test_delete(run: Callable[..., None]) -> None:
    async def scenario(store: StateStore) -> None:
        await store.put("responses", "k", b"v")
        assert await store.delete("responses", "k") is True
        assert await store.get("responses", "k") is None
        assert await store.delete("responses", "k") is False
        assert await store.delete("responses", "never") is False

    run(scenario)


def test_namespaces_are_independent(run: Callable[..., None]) -> None:
    async def scenario(store: StateStore) -> None:
        await store.put("responses", "call_1", b"a response")
        await store.put("reasoning", "call_1", b"some reasoning")
        assert await store.get("responses", "call_1") == b"a response"
        assert await store.get("reasoning", "call_1") == b"some reasoning"
        assert await store.delete("responses", "call_1")
        assert await store.get("responses", "call_1") is None
        assert await store.get("reasoning", "call_1") == b"some reasoning"

    run(scenario)


def test_keys_are_any_string(run: Callable[..., None]) -> None:
    keys = ["a:b", "a", "b:c", "ключ ✓", " ", "x" * 500]

    async def scenario(store: StateStore) -> None:
        for i, key in enumerate(keys):
            await store.put("reasoning", key, str(i).encode())
        for i, key in enumerate(keys):
            assert await store.get("reasoning", key) == str(i).encode()

    run(scenario)


def test_namespace_without_colon(run: Callable[..., None]) -> None:
    async def scenario(store: StateStore) -> None:
        for bad in ("a:b", ""):
            with pytest.raises(ValueError, match="namespace"):
                await store.put(bad, "k", b"v")
            with pytest.raises(ValueError, match="namespace"):
                await store.get(bad, "k")

    run(scenario)


def test_ttl_must_be_positive(run: Callable[..., None]) -> None:
    async def scenario(store: StateStore) -> None:
        for ttl in (0, -1.0):
            with pytest.raises(ValueError, match="ttl"):
                await store.put("responses", "k", b"v", ttl=ttl)
        assert await store.get("responses", "k") is None

    run(scenario)


def test_short_ttl_expires(run: Callable[..., None]) -> None:
    """Real time on both stores (the memory store's clock is tested without sleeping in test_memory.py)."""

    async def scenario(store: StateStore) -> None:
        await store.put("responses", "short", b"v", ttl=0.05)
        await store.put("responses", "long", b"v", ttl=600)
        for _ in range(200):  # bounded: 200 x 25 ms
            if await store.get("responses", "short") is None:
                break
            await asyncio.sleep(0.025)
        assert await store.get("responses", "short") is None
        assert await store.get("responses", "long") == b"v"

    run(scenario)


def test_concurrent_operations(run: Callable[..., None]) -> None:
    async def scenario(store: StateStore) -> None:
        await asyncio.gather(*(store.put("reasoning", f"k{i}", f"v{i}".encode()) for i in range(100)))
        values = await asyncio.gather(*(store.get("reasoning", f"k{i}") for i in range(100)))
        assert values == [f"v{i}".encode() for i in range(100)]

    run(scenario)


def test_ping_and_describe(run: Callable[..., None]) -> None:
    async def scenario(store: StateStore) -> None:
        await store.ping()
        assert store.describe() == "memory" or store.describe().startswith("redis://127.0.0.1:")

    run(scenario)
