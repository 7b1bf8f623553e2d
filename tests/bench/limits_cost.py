"""What a limited key costs per request (`make bench-limits`): the limiter's admission and settle against a real
redis-server on loopback (one Lua round trip each) and against the in-process counters, then whole requests through
the proxy with an unlimited key and with a limited one (the same proxy, Redis state store, a mock MindIE).
Prints microseconds per call and the median request times; docs/sharing.md quotes the figures."""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from proxy.gateway.keys import KeyPolicy  # noqa: E402
from proxy.gateway.limits import Limiter, LimitSettings  # noqa: E402
from proxy.mock import create_app as create_mock  # noqa: E402
from proxy.server.app import create_app  # noqa: E402
from proxy.settings import build_settings  # noqa: E402
from proxy.state.counters_redis import RedisCounters  # noqa: E402
from proxy.state.redis import RedisStore  # noqa: E402
from tests.conftest import REDIS_SERVER, RedisServer, ServerThread  # noqa: E402

N = 2000
STORE = sys.argv[1] if len(sys.argv) > 1 else ""
POLICY = KeyPolicy("bench", requests_per_minute=10**9, tokens_per_minute=10**12, max_concurrent=10**6)
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}


async def limiter_cost(limiter: Limiter) -> tuple[float, float]:
    """Microseconds per admission and per settle (awaited one after the other)."""
    admit = settle = 0.0
    for _ in range(N):
        t0 = time.perf_counter()
        grant, _ = await limiter.admit(POLICY, "m", BODY, 120, True)
        t1 = time.perf_counter()
        assert grant is not None
        await grant.counters.settle(grant.ask, 30)
        t2 = time.perf_counter()
        admit += t1 - t0
        settle += t2 - t1
    return admit / N * 1e6, settle / N * 1e6


def request_times(url: str, n: int = 400) -> tuple[float, float]:
    """Median milliseconds of a request with the unlimited key and with the limited one, taken in turns (so that
    the machine's other load falls on both alike)."""
    times: dict[str, list[float]] = {"sk-open": [], "sk-lim": []}
    with httpx.Client(timeout=30) as client:
        for i in range(n):
            key = "sk-open" if i % 2 else "sk-lim"
            t0 = time.perf_counter()
            reply = client.post(url + "/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {key}"})
            assert reply.status_code == 200
            times[key].append(time.perf_counter() - t0)
    return statistics.median(times["sk-open"]) * 1000, statistics.median(times["sk-lim"]) * 1000


def main() -> None:
    if not REDIS_SERVER:
        sys.exit("needs redis-server (make system-deps)")
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(Path(tmp)).start()
        try:
            async def micro() -> None:
                store = RedisStore(redis.url)
                shared = Limiter(RedisCounters(store, 1.0), LimitSettings())
                local = Limiter(None, LimitSettings())
                for name, limiter in (("redis (loopback)", shared), ("memory", local)):
                    await limiter_cost(limiter)  # warm
                    admit, settle = await limiter_cost(limiter)
                    print(f"limiter {name:17s} admit {admit:7.1f} us   settle {settle:7.1f} us")
                await store.close()

            asyncio.run(micro())
            keys = Path(tmp) / "keys.yaml"
            keys.write_text("open: sk-open\nlimited:\n  key: sk-lim\n  requests_per_minute: 1000000\n"
                            "  tokens_per_minute: 1000000000\n")
            mock = ServerThread(create_mock("mindie")).start()
            settings = build_settings(config={
                "upstreams": [{"name": "m", "dialect": "mindie", "url": mock.url}],
                "server": {"api_keys_file": str(keys), "state_store": STORE or redis.url, "log_level": "warning"}},
                environ={})
            proxy = ServerThread(create_app(settings)).start()
            try:
                request_times(proxy.url, 50)
                plain, limited = request_times(proxy.url, 1000)
                print(f"request median: unlimited key {plain:.2f} ms, limited key {limited:.2f} ms "
                      f"(+{(limited - plain) * 1000:.0f} us)")
            finally:
                proxy.stop()
                mock.stop()
        finally:
            redis.stop()


if __name__ == "__main__":
    main()
