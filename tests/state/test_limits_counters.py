"""The per-key limit counters in a real redis-server (proxy/state/limits.lua through RedisCounters) and in memory:
the same answers, atomic under concurrent admissions, settled to the real usage, and a silent Redis a bounded
CountersUnavailable."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from proxy.state.counters import Counters, CountersUnavailable, LimitAsk, MemoryCounters
from proxy.state.counters_redis import RedisCounters
from proxy.state.redis import RedisStore
from tests.conftest import RedisServer

T = TypeVar("T")
ASK = LimitAsk("team-a", "", 10, 0, 0, 0, 0, 0, "2026-11-27", "2026-11", 60.0, 60.0)


def run(coro: Coroutine[Any, Any, T]) -> T:
    async def guarded() -> T:
        return await asyncio.wait_for(coro, 30)

    return asyncio.run(guarded())


def ask(n: int, **limits: Any) -> LimitAsk:
    return dataclasses.replace(ASK, lease=f"lease-{n}", **limits)


async def both(redis_url: str) -> list[tuple[Counters, RedisStore | None]]:
    store = RedisStore(redis_url)
    return [(RedisCounters(store, 1.0), store), (MemoryCounters(), None)]


@pytest.mark.parametrize("which", [0, 1], ids=["redis", "memory"])
def test_requests_per_minute_is_exact_under_concurrent_admissions(redis_url: str, which: int) -> None:
    async def main() -> list[bool]:
        counters, store = (await both(redis_url))[which]
        verdicts = await asyncio.gather(*(counters.admit(ask(i, requests_per_minute=7)) for i in range(20)))
        if store is not None:
            await store.close()
        refused = [v for v in verdicts if not v.allowed]
        assert {v.reason for v in refused} == {"requests"}
        assert all(55 < v.retry_after <= 60 for v in refused)
        return [v.allowed for v in verdicts]

    assert sum(run(main())) == 7


@pytest.mark.parametrize("which", [0, 1], ids=["redis", "memory"])
def test_tokens_are_reserved_then_settled_to_the_real_usage(redis_url: str, which: int) -> None:
    async def main() -> None:
        counters, store = (await both(redis_url))[which]
        first = ask(1, cost=60, tokens_per_minute=100, tokens_per_day=1000)
        assert (await counters.admit(first)).allowed
        refused = await counters.admit(ask(2, cost=60, tokens_per_minute=100, tokens_per_day=1000))
        assert (refused.allowed, refused.reason, refused.tokens) == (False, "tokens", 60)
        await counters.settle(first, 15)  # it used 15 of its 60
        second = await counters.admit(ask(3, cost=60, tokens_per_minute=100, tokens_per_day=1000))
        assert (second.allowed, second.tokens, second.day_used) == (True, 75, 75)
        assert await counters.usage("team-a", "2026-11-27", "2026-11") == (75, 75)
        too_large = await counters.admit(ask(4, cost=101, tokens_per_minute=100))
        assert (too_large.allowed, too_large.reason) == (False, "too_large")
        quota = await counters.admit(ask(5, cost=30, tokens_per_day=100))
        assert (quota.allowed, quota.reason) == (False, "day")
        if store is not None:
            await store.close()

    run(main())


@pytest.mark.parametrize("which", [0, 1], ids=["redis", "memory"])
def test_concurrency_leases_are_given_back_when_settled(redis_url: str, which: int) -> None:
    async def main() -> None:
        counters, store = (await both(redis_url))[which]
        held = [ask(i, max_concurrent=2) for i in range(2)]
        assert all([(await counters.admit(a)).allowed for a in held])
        refused = await counters.admit(ask(9, max_concurrent=2))
        assert (refused.allowed, refused.reason) == (False, "concurrent")
        await counters.settle(held[0], 10)
        assert (await counters.admit(ask(10, max_concurrent=2))).allowed
        if store is not None:
            await store.close()

    run(main())


def test_a_silent_redis_is_a_bounded_counters_unavailable(start_redis: Any) -> None:
    srv: RedisServer = start_redis()

    async def main() -> float:
        store = RedisStore(srv.url, timeout=0.3)
        counters = RedisCounters(store, 0.3)
        assert (await counters.admit(ask(1, requests_per_minute=5))).allowed
        srv.proc.send_signal(19) if srv.proc else None  # SIGSTOP: connected, silent
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            with pytest.raises(CountersUnavailable):
                await counters.admit(ask(2, requests_per_minute=5))
            return loop.time() - started
        finally:
            if srv.proc:
                srv.proc.send_signal(18)  # SIGCONT
            await store.close()

    assert run(main()) < 1.0
