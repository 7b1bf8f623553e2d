"""MemoryStore (proxy/state/memory.py): bounded by entries, bytes and TTL; the oldest go first. A fake clock, no
sleeping."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from proxy.state import MemoryStore, StoreUnavailable, ValueTooLarge

T = TypeVar("T")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def present(store: MemoryStore, namespace: str, keys: list[str]) -> list[str]:
    return [k for k in keys if await store.get(namespace, k) is not None]


def test_defaults() -> None:
    store = MemoryStore()
    assert (store.max_entries, store.max_bytes, store.ttl) == (10_000, 256 * 1024 * 1024, 86_400)


def test_bounded_by_count_oldest_first() -> None:
    async def main() -> None:
        store = MemoryStore(max_entries=3)
        for k in "abcde":
            await store.put("responses", k, b"v")
        assert len(store) == 3
        assert await present(store, "responses", list("abcde")) == ["c", "d", "e"]

    run(main())


def test_replacing_makes_an_entry_the_newest() -> None:
    async def main() -> None:
        store = MemoryStore(max_entries=3)
        for k in "abc":
            await store.put("responses", k, b"v")
        await store.put("responses", "a", b"again")  # a is now the newest; b is the oldest
        await store.put("responses", "d", b"v")
        assert await present(store, "responses", list("abcd")) == ["a", "c", "d"]
        assert await store.get("responses", "a") == b"again"
        assert len(store) == 3

    run(main())


def test_bounded_by_bytes_counting_key_and_value() -> None:
    async def main() -> None:
        store = MemoryStore(max_bytes=100)
        # each entry: 40 value + len("ns") + len("kN") = 44 bytes
        for i in range(4):
            await store.put("ns", f"k{i}", b"x" * 40)
        assert store.size_bytes == 88  # two fit in 100 bytes; the two oldest went
        assert await present(store, "ns", [f"k{i}" for i in range(4)]) == ["k2", "k3"]
        await store.put("ns", "big", b"x" * 95)  # 100 bytes exactly: everything else goes
        assert await present(store, "ns", ["k2", "k3", "big"]) == ["big"]
        assert store.size_bytes == 100

    run(main())


def test_bytes_count_utf8_of_keys() -> None:
    async def main() -> None:
        store = MemoryStore()
        await store.put("ns", "ключ", b"abc")
        assert store.size_bytes == 3 + 2 + len("ключ".encode())
        await store.put("ns", "ключ", b"a")  # replacing does not count twice
        assert store.size_bytes == 1 + 2 + 8
        await store.delete("ns", "ключ")
        assert store.size_bytes == 0 and len(store) == 0

    run(main())


def test_a_value_bigger_than_the_store_is_refused_not_lost_silently() -> None:
    async def main() -> None:
        store = MemoryStore(max_bytes=50)
        await store.put("ns", "small", b"v")
        with pytest.raises(ValueTooLarge) as err:
            await store.put("ns", "huge", b"x" * 60)
        assert isinstance(err.value, StoreUnavailable) and err.value.status == 503
        assert "server.state_max_bytes" in err.value.message
        assert await store.get("ns", "small") == b"v"  # nothing was evicted for it

    run(main())


def test_ttl_expiry_with_the_default_ttl() -> None:
    async def main() -> None:
        clock = Clock()
        store = MemoryStore(ttl=60, clock=clock)
        await store.put("ns", "a", b"v")
        clock.now += 59.9
        assert await store.get("ns", "a") == b"v"
        clock.now += 0.1
        assert await store.get("ns", "a") is None
        assert len(store) == 0 and store.size_bytes == 0  # dropped when read

    run(main())


def test_put_ttl_overrides_the_default() -> None:
    async def main() -> None:
        clock = Clock()
        store = MemoryStore(ttl=60, clock=clock)
        await store.put("ns", "short", b"v", ttl=5)
        await store.put("ns", "long", b"v", ttl=3600)
        await store.put("ns", "default", b"v")
        clock.now += 10
        assert await present(store, "ns", ["short", "long", "default"]) == ["long", "default"]
        clock.now += 60
        assert await present(store, "ns", ["short", "long", "default"]) == ["long"]

    run(main())


def test_expired_entries_make_room_on_insertion() -> None:
    async def main() -> None:
        clock = Clock()
        store = MemoryStore(max_entries=3, ttl=60, clock=clock)
        for k in "abc":
            await store.put("ns", k, b"v")
        clock.now += 30
        await store.put("ns", "d", b"v")  # full: a (the oldest, alive) goes
        clock.now += 31  # b and c expired, d alive
        await store.put("ns", "e", b"v")
        assert len(store) == 2  # b and c dropped without being read, nothing alive evicted
        assert await present(store, "ns", list("abcde")) == ["d", "e"]

    run(main())


def test_delete_of_an_expired_entry_is_false() -> None:
    async def main() -> None:
        clock = Clock()
        store = MemoryStore(ttl=1, clock=clock)
        await store.put("ns", "a", b"v")
        clock.now += 2
        assert await store.delete("ns", "a") is False
        assert len(store) == 0

    run(main())


def test_close_empties_the_store() -> None:
    async def main() -> None:
        store = MemoryStore()
        await store.put("ns", "a", b"v")
        await store.close()
        assert len(store) == 0 and store.size_bytes == 0
        assert await store.get("ns", "a") is None

    run(main())


def test_bounds_must_be_positive() -> None:
    for kw in ({"max_entries": 0}, {"max_bytes": 0}, {"ttl": 0}):
        with pytest.raises(ValueError):
            MemoryStore(**kw)  # type: ignore[arg-type]


def test_many_entries_stay_bounded() -> None:
    """20,000 puts into a 1,000-entry store: always within bounds, and the last 1,000 are the ones kept."""

    async def main() -> None:
        store = MemoryStore(max_entries=1000, max_bytes=64 * 1024)
        for i in range(20_000):
            await store.put("reasoning", f"call_{i}", b"r" * (i % 97))
            assert len(store) <= 1000 and store.size_bytes <= 64 * 1024
        kept = await present(store, "reasoning", [f"call_{i}" for i in range(20_000)])
        assert kept == [f"call_{i}" for i in range(20_000 - len(kept), 20_000)]

    run(main())
