"""RedisCounters: the per-key limit counters (proxy/state/counters.py) in a Redis shared by every process and replica,
each call one Lua script (proxy/state/limits.lua) run atomically by the server: one round trip to admit a request,
one to settle it. Keys are `dialect-proxy:limits:{NAME}:...`, the key's name in braces, so that on a Redis Cluster
all of one key's counters sit in one slot (a script may touch only one).

Every call has a deadline (`timeout`, server.limits_timeout): a Redis that does not answer in time is
`CountersUnavailable`, and the limiter fails open or closed (proxy/gateway/limits.py).
"""

from __future__ import annotations

import asyncio
from importlib import resources
from typing import Any, Final

from proxy.state.counters import CountersUnavailable, LimitAsk, Verdict
from proxy.state.redis import KEY_PREFIX, RedisStore

SCRIPT: Final = resources.files("proxy.state").joinpath("limits.lua").read_text(encoding="utf-8")


class RedisCounters:
    def __init__(self, store: RedisStore, timeout: float) -> None:
        from redis.exceptions import RedisError

        self.store = store
        self.timeout = timeout
        self._script: Any = store.client.register_script(SCRIPT)
        self._errors: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)

    def describe(self) -> str:
        return self.store.describe()

    @staticmethod
    def keys(key: str, day: str, month: str) -> list[str]:
        base = f"{KEY_PREFIX}:limits:{{{key}}}"
        return [f"{base}:window", f"{base}:tokens", f"{base}:leases", f"{base}:day:{day}", f"{base}:month:{month}"]

    async def admit(self, ask: LimitAsk) -> Verdict:
        args = ["admit", ask.lease, ask.cost, ask.requests_per_minute, ask.tokens_per_minute, ask.max_concurrent,
                ask.tokens_per_day, ask.tokens_per_month, round(ask.window * 1000), round(ask.lease_ttl * 1000)]
        reply = await self._run(self.keys(ask.key, ask.day, ask.month), args)
        allowed, reason, retry, requests, tokens, reset, day, month = reply
        return Verdict(bool(allowed), reason.decode() if isinstance(reason, bytes) else str(reason), retry / 1000,
                       int(requests), int(tokens), reset / 1000, int(day), int(month))

    async def settle(self, ask: LimitAsk, used: int) -> None:
        await self._run(self.keys(ask.key, ask.day, ask.month), ["settle", ask.lease, ask.cost, used])

    async def usage(self, key: str, day: str, month: str) -> tuple[int, int]:
        names = self.keys(key, day, month)[3:]
        values = await self._call(self.store.client.mget(names))
        return int(values[0] or 0), int(values[1] or 0)

    async def _run(self, keys: list[str], args: list[Any]) -> Any:
        return await self._call(self._script(keys=keys, args=args))

    async def _call(self, op: Any) -> Any:
        try:
            async with asyncio.timeout(self.timeout):
                return await op
        except self._errors as e:
            raise CountersUnavailable(f"{type(e).__name__}: {e}"[:200]) from None

