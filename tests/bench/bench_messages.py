"""Benchmark: the proxy's CPU per upstream chunk for a Messages stream (`/v1/messages`) against the same upstream
stream served as Chat Completions (`/v1/chat/completions`), measured in the same run (the issue's bar: at most 1.2x).

    python tests/bench/bench_messages.py [--dialect openai|mindie|deepseek|siliconstorm] [--seconds 4]

Starts the mock and the proxy as processes (pinned as tests/bench/bench.py does), sends 64-chunk zero-delay streams
at concurrency 16 to each route in turn (alternating, twice), and prints requests/s and the proxy's CPU time
(utime+stime from /proc) per request and per upstream chunk, and the messages/chat ratio. Bounded in time and count.
Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import time

import aiohttp
from bench import cpu_seconds, free_port, start, wait_up

CHUNKS = 64


async def load(url: str, body: dict[str, object], concurrency: int, seconds: float, max_requests: int) -> int:
    done = 0
    issued = 0
    stop_at = time.monotonic() + seconds
    conn = aiohttp.TCPConnector(limit=concurrency + 4)
    headers = {"x-api-key": "bench", "anthropic-version": "2023-06-01"}
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=60)) as s:
        async def worker() -> None:
            nonlocal done, issued
            while time.monotonic() < stop_at and issued < max_requests:
                issued += 1
                async with s.post(url, json=body, headers=headers) as r:
                    async for _ in r.content.iter_any():
                        pass
                    if r.status == 200:
                        done += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dialect", default="openai", choices=["openai", "mindie", "deepseek", "siliconstorm"])
    ap.add_argument("--seconds", type=float, default=4.0)
    args = ap.parse_args()
    two_cpus = (os.cpu_count() or 1) >= 2
    mock_port, proxy_port = free_port(), free_port()
    mock = start(["mock", "--port", str(mock_port), "--dialect", args.dialect], 1 if two_cpus else None)
    proxy = start(["serve", "--port", str(proxy_port), "--upstream-url", f"http://127.0.0.1:{mock_port}",
                   "--upstream-dialect", args.dialect, "--log-level", "warning"], 0 if two_cpus else None)
    text = f"bench [mock:chunks={CHUNKS}]"
    routes = {
        "chat": (f"http://127.0.0.1:{proxy_port}/v1/chat/completions",
                 {"model": "bench", "stream": True, "messages": [{"role": "user", "content": text}]}),
        "messages": (f"http://127.0.0.1:{proxy_port}/v1/messages",
                     {"model": "bench", "stream": True, "max_tokens": 1024,
                      "messages": [{"role": "user", "content": text}]}),
    }
    try:
        await wait_up(f"http://127.0.0.1:{mock_port}/health")
        await wait_up(f"http://127.0.0.1:{proxy_port}/healthz")
        print(f"dialect={args.dialect}; {CHUNKS}-chunk streams, concurrency 16, {args.seconds:g} s per run; "
              f"proxy pinned to CPU 0: {two_cpus}\n")
        totals = {name: [0.0, 0] for name in routes}
        for _ in range(2):
            for name, (url, body) in routes.items():
                await load(url, body, 16, 0.3, 300)  # warm-up
                c0, t0 = cpu_seconds(proxy.pid), time.perf_counter()
                done = await load(url, body, 16, args.seconds, 100_000)
                cpu, elapsed = cpu_seconds(proxy.pid) - c0, time.perf_counter() - t0
                totals[name][0] += cpu
                totals[name][1] += done
                print(f"{name:<9} {done / elapsed:8.1f} req/s  {cpu / max(done, 1) * 1e6:8.0f} µs CPU/request  "
                      f"{cpu / max(done * CHUNKS, 1) * 1e6:6.1f} µs CPU/upstream chunk", flush=True)
        per_chunk = {name: cpu / max(done * CHUNKS, 1) for name, (cpu, done) in totals.items()}
        print(f"\nmessages/chat CPU per chunk: {per_chunk['messages'] / per_chunk['chat']:.2f}x "
              f"({per_chunk['messages'] * 1e6:.1f} vs {per_chunk['chat'] * 1e6:.1f} µs)")
    finally:
        for proc in (proxy, mock):
            proc.send_signal(signal.SIGINT)
        for proc in (proxy, mock):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    asyncio.run(main())
