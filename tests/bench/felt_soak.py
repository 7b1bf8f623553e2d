"""The memory soak of `make bench-felt` (tests/bench/felt.py): the compiled proxy's resident memory over time under a
fixed load, the board's way: idle (before it serves a request), steady (under the load), the growth rate, and
recovered (after the load stops).

The load, fixed for the whole soak: 4 clients making non-stream requests back to back and 32 making 64-frame streams
paced 20 ms (tests/bench/felt_mock.py), half of each in OpenAI chat, half in Anthropic Messages (translated to the
OpenAI upstream). RSS is read from /proc every `SAMPLE` seconds. The growth rate is the least-squares slope of RSS
over time after the first fifth of the soak (pools and caches growing to their size), in MiB per minute, with twice
its standard error as the noise; a slope above its noise that also adds up to more than `GROWTH_FLOOR_MIB` over the
soak is a growth, reported as such (a defect: issue 48). Loopback only; bounded by the soak's seconds.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from dataclasses import dataclass

import bench  # tests/bench/bench.py
import felt_load

SAMPLE = 1.0
GROWTH_FLOOR_MIB = 1.0
IDLE_SECONDS = 10.0
RECOVERY_SECONDS = 15.0


@dataclass
class Soak:
    idle_mib: float
    steady_mib: float
    growth_mib_min: float
    noise_mib_min: float
    recovered_mib: float
    requests: int
    streams: int
    failed: int

    minutes: float

    @property
    def grows(self) -> bool:
        """A slope above its noise that adds up to more than GROWTH_FLOOR_MIB over the soak."""
        return self.growth_mib_min - self.noise_mib_min > 0 and self.growth_mib_min * self.minutes > GROWTH_FLOOR_MIB


def slope(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares slope of (t, y) and its standard error."""
    n = len(points)
    if n < 3:
        return math.nan, math.nan
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((t - mt) ** 2 for t, _ in points)
    b = sum((t - mt) * (y - my) for t, y in points) / sxx
    a = my - b * mt
    resid = sum((y - a - b * t) ** 2 for t, y in points)
    return b, math.sqrt(resid / (n - 2) / sxx)


async def sample(pid: int, seconds: float, out: list[tuple[float, float]], t0: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        out.append((time.monotonic() - t0, bench.rss_kib(pid) / 1024))
        await asyncio.sleep(SAMPLE)


async def soak(tree: str | None, seconds: float, upstream_port: int, cpu: int) -> Soak:
    port = bench.free_port()
    proc = bench.start(["serve", "--port", str(port), "--upstream-url", f"http://127.0.0.1:{upstream_port}",
                        "--upstream-dialect", "openai", "--log-level", "warning"], cpu, cwd=tree)
    try:
        await bench.wait_up(f"http://127.0.0.1:{port}/healthz")
        t0 = time.monotonic()
        idle: list[tuple[float, float]] = []
        await sample(proc.pid, min(IDLE_SECONDS, max(2.0, seconds / 10)), idle, t0)
        clients = [felt_load.Client(port, api, stream) for api in ("chat", "messages") for stream in (False, True)]
        runs = [c.run(16 if c.stream else 2, seconds) for c in clients]
        under: list[tuple[float, float]] = []
        load_t0 = time.monotonic()
        results = await asyncio.gather(*runs, sample(proc.pid, seconds, under, t0))
        load_s = time.monotonic() - load_t0
        after: list[tuple[float, float]] = []
        await sample(proc.pid, recovery_seconds(seconds), after, t0)
        if died := bench.died(proc):
            raise RuntimeError(died)
    finally:
        bench.stop(proc)
    answers = [a for r in results[:-1] for a in r]
    failed = sum(1 for a in answers if a.status != 200 or not a.complete)
    streams = sum(len(r) for c, r in zip(clients, results, strict=False) if c.stream)
    warm = [(t, y) for t, y in under if t - (load_t0 - t0) >= load_s / 5]
    b, se = slope(warm)
    return Soak(statistics.median(y for _, y in idle), statistics.median(y for _, y in under[len(under) // 2:]),
                b * 60, 2 * se * 60, after[-1][1] if after else math.nan, len(answers) - streams, streams, failed,
                load_s / 60)


def recovery_seconds(seconds: float) -> float:
    return min(RECOVERY_SECONDS, max(3.0, seconds / 10))


def report(s: Soak, seconds: float) -> list[str]:
    verdict = "GROWS (a defect)" if s.grows else "no growth above noise"
    return [f"memory soak, compiled proxy, {seconds:g} s under a fixed load (4 non-stream clients, 32 streams paced "
            f"20 ms; chat and Messages): {s.requests} requests, {s.streams} streams, {s.failed} failed",
            f"  RSS idle {s.idle_mib:.1f} MiB, steady {s.steady_mib:.1f} MiB, growth {s.growth_mib_min * 1024:+.1f} "
            f"± {s.noise_mib_min * 1024:.1f} KiB/min (after the first fifth), recovered {s.recovered_mib:.1f} MiB "
            f"{recovery_seconds(seconds):g} s after the load: {verdict}"]
