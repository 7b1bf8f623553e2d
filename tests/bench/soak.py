"""Soak run: mixed traffic through the proxy for a bounded time, watching for leaks and wrong answers.

    python tests/bench/soak.py [--seconds 120] [--concurrency 32] [--dialect mindie]

Starts the mock (full-text MindIE by default) and the proxy as processes on loopback, then runs a bounded mix:
normal streams and non-streams, think-tag streams, tool calls, upstream errors, mid-stream upstream drops and
client disconnects. Every answer is checked (streams must end in [DONE] or an error event, never silently), and
the proxy's RSS, open file descriptors and in-flight gauge are printed over time. Exits non-zero on a wrong answer,
on steady growth of RSS or file descriptors, or if in-flight requests are left behind. Loopback only; every loop
bounded in time and count.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import signal
import sys
import time

import aiohttp

sys.path.insert(0, os.path.dirname(__file__))
from bench import free_port, start, wait_up  # noqa: E402

SCENARIOS = [
    ("stream", True, "Hello [mock:chunks=32]", "done"),
    ("non-stream", False, "Hello [mock:chunks=16]", "ok"),
    ("think", True, "Hi [mock:think]", "done"),
    ("tools", True, "Weather? [mock:tool_calls]", "done"),
    ("upstream-503", False, "x [mock:error=503]", "status:503"),
    ("upstream-drop", True, "x [mock:chunks=20][mock:drop=5]", "error_event"),
    ("client-leaves", True, "x [mock:chunks=200][mock:delay_ms=10]", "client_leaves"),
]


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        m = re.search(r"VmRSS:\s+(\d+)", f.read())
    return int(m.group(1)) if m else 0


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def one(session: aiohttp.ClientSession, base: str, scenario: tuple[str, bool, str, str]) -> str | None:
    name, stream, text, expect = scenario
    body = {"model": "soak", "stream": stream, "messages": [{"role": "user", "content": text}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
            if name == "tools" else None}
    body = {k: v for k, v in body.items() if v is not None}
    async with session.post(base + "/v1/chat/completions", json=body) as r:
        if expect.startswith("status:"):
            await r.read()
            return None if r.status == int(expect.split(":")[1]) else f"{name}: status {r.status}"
        if r.status != 200:
            return f"{name}: status {r.status}: {(await r.read())[:200]!r}"
        if not stream:
            data = await r.json()
            return None if data["choices"][0]["message"]["content"] else f"{name}: empty content"
        last = b""
        n = 0
        async for line in r.content:
            if line.startswith(b"data: "):
                last = line.strip()
                n += 1
                if expect == "client_leaves" and n == 3:
                    return None  # leaving the context closes the connection mid-stream
        if expect == "done":
            return None if last == b"data: [DONE]" else f"{name}: ended with {last[:120]!r}"
        if expect == "error_event":
            return None if last.startswith(b'data: {"error"') else f"{name}: no error event: {last[:120]!r}"
        return f"{name}: unexpected end"


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--dialect", default="mindie")
    ap.add_argument("--max-requests", type=int, default=1_000_000)
    args = ap.parse_args()
    mock_port, proxy_port = free_port(), free_port()
    mock_argv = ["mock", "--port", str(mock_port), "--dialect", args.dialect]
    proxy_argv = ["serve", "--port", str(proxy_port), "--upstream-url", f"http://127.0.0.1:{mock_port}",
                  "--upstream-dialect", args.dialect, "--log-level", "warning"]
    if args.dialect in ("mindie", "siliconstorm"):
        mock_argv.append("--full-text")
        proxy_argv.append("--full-text")
    mock = start(mock_argv, None)
    proxy = start(proxy_argv, None)
    failures: list[str] = []
    samples: list[tuple[float, int, int]] = []
    counts = {s[0]: 0 for s in SCENARIOS}
    try:
        await wait_up(f"http://127.0.0.1:{mock_port}/health")
        await wait_up(f"http://127.0.0.1:{proxy_port}/healthz")
        base = f"http://127.0.0.1:{proxy_port}"
        stop_at = time.monotonic() + args.seconds
        issued = 0
        rng = random.Random(7)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            async def worker() -> None:
                nonlocal issued
                while time.monotonic() < stop_at and issued < args.max_requests:
                    issued += 1
                    scenario = rng.choice(SCENARIOS)
                    counts[scenario[0]] += 1
                    try:
                        problem = await one(session, base, scenario)
                    except (TimeoutError, aiohttp.ClientError) as e:
                        problem = f"{scenario[0]}: {type(e).__name__}: {e}"
                    if problem and len(failures) < 50:
                        failures.append(problem)

            async def sampler() -> None:
                t0 = time.monotonic()
                while time.monotonic() < stop_at:
                    samples.append((time.monotonic() - t0, rss_kb(proxy.pid), fds(proxy.pid)))
                    print(f"t={samples[-1][0]:6.1f}s  rss={samples[-1][1] / 1024:7.1f} MiB  fds={samples[-1][2]:4d}"
                          f"  requests={issued}", flush=True)
                    await asyncio.sleep(min(10.0, max(args.seconds / 12, 1.0)))

            await asyncio.gather(sampler(), *(worker() for _ in range(args.concurrency)))
        await asyncio.sleep(1.0)
        async with aiohttp.ClientSession() as s, s.get(base + "/metrics") as r:
            text = await r.text()
        in_flight = sum(float(line.split()[-1]) for line in text.splitlines()
                        if line.startswith("dialect_proxy_in_flight_requests"))
    finally:
        for proc in (proxy, mock):
            proc.send_signal(signal.SIGINT)
        for proc in (proxy, mock):
            try:
                proc.wait(timeout=15)
            except Exception:
                proc.kill()
    print("\nrequests per scenario:", counts)
    verdict = 0
    if failures:
        print(f"{len(failures)} wrong answers, first ones:", *failures[:10], sep="\n  ")
        verdict = 1
    if in_flight:
        print(f"in-flight gauge after the run: {in_flight} (should be 0)")
        verdict = 1
    if len(samples) >= 4:
        half = len(samples) // 2
        rss_early = max(s[1] for s in samples[1:half])
        rss_late = max(s[1] for s in samples[half:])
        fd_early = max(s[2] for s in samples[1:half])
        fd_late = max(s[2] for s in samples[half:])
        print(f"RSS max first half {rss_early / 1024:.1f} MiB, second half {rss_late / 1024:.1f} MiB; "
              f"fds {fd_early} -> {fd_late}")
        if rss_late > rss_early * 1.25 + 10240 or fd_late > fd_early + 50:
            print("steady growth: possible leak")
            verdict = 1
    print("soak:", "OK" if verdict == 0 else "FAILED")
    return verdict


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
