"""Benchmark: the mock upstream direct vs the proxy in front of it, measured in the same run.

    python tests/bench/bench.py [--dialect openai|mindie] [--full-text] [--seconds 4] [--quick]

Starts the built-in mock and the proxy as separate processes on loopback (the proxy pinned to CPU 0, the mock to
CPU 1 when the machine has two), drives them from this process with aiohttp, and prints for each scenario
(non-stream; 64-chunk streams zero-delay and 5 ms-paced; concurrency 1/16/64): requests/s, latency p50/p90/p99,
time to first chunk for streams, the proxy's CPU time per request and per relayed chunk (from /proc), and the
proxy/direct throughput ratio. Every run is bounded in time and count. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import aiohttp

CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / CLK_TCK  # utime + stime


def start(argv: list[str], cpu: int | None) -> subprocess.Popen[bytes]:
    """`python -m proxy ARGV`, or a script when ARGV[0] ends in .py."""
    def pin() -> None:
        if cpu is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {cpu})

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, *argv] if argv[0].endswith(".py") else [sys.executable, "-m", "proxy", *argv]
    return subprocess.Popen(cmd, preexec_fn=pin, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def wait_up(url: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            try:
                async with s.get(url) as r:
                    if r.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


@dataclass
class Result:
    latencies: list[float] = field(default_factory=list)
    ttfb: list[float] = field(default_factory=list)
    chunks: int = 0
    errors: int = 0
    elapsed: float = 0.0

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed else 0.0


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


# Client dialects: the path and the request body of one prompt (the same upstream request for each).
CLIENT_APIS = {
    "chat": ("/v1/chat/completions", lambda text, stream: {
        "model": "bench", "stream": stream, "messages": [{"role": "user", "content": text}]}),
    "responses": ("/v1/responses", lambda text, stream: {
        "model": "bench", "stream": stream, "store": False, "input": text}),
}


async def load(base: str, stream: bool, chunks: int, delay_ms: int, concurrency: int, seconds: float,
               max_requests: int, api: str = "chat") -> Result:
    directive = f"[mock:chunks={chunks}][mock:delay_ms={delay_ms}]" if stream else "[mock:chunks=16]"
    path, make = CLIENT_APIS[api]
    body = make("bench " + directive, stream)
    res = Result()
    stop_at = time.monotonic() + seconds
    issued = 0
    conn = aiohttp.TCPConnector(limit=concurrency + 4)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=60)) as s:
        async def worker() -> None:
            nonlocal issued
            while time.monotonic() < stop_at and issued < max_requests:
                issued += 1
                t0 = time.perf_counter()
                try:
                    async with s.post(base + path, json=body) as r:
                        if r.status != 200:
                            res.errors += 1
                            await r.read()
                            continue
                        if stream:
                            # Count events per read, not per line: the load generator shares the machine with
                            # what it measures, so it must stay cheap. The 6-byte tail catches a marker split
                            # across two reads without counting one twice.
                            n = 0
                            tail = b""
                            async for data in r.content.iter_any():
                                buf = tail + data
                                found = buf.count(b"data: {")  # chat chunks / Responses events
                                if found and not n:
                                    res.ttfb.append(time.perf_counter() - t0)
                                n += found
                                tail = buf[-6:]
                            res.chunks += n
                        else:
                            await r.read()
                            res.chunks += 1
                except aiohttp.ClientError:
                    res.errors += 1
                    continue
                res.latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        res.elapsed = time.perf_counter() - t0
    return res


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dialect", default="openai", choices=["openai", "mindie", "deepseek", "siliconstorm"])
    ap.add_argument("--full-text", action="store_true")
    ap.add_argument("--seconds", type=float, default=4.0, help="duration of each scenario (bounded)")
    ap.add_argument("--quick", action="store_true", help="concurrency 16 only, 2 s each")
    args = ap.parse_args()
    seconds = 2.0 if args.quick else args.seconds
    concurrencies = [16] if args.quick else [1, 16, 64]
    two_cpus = (os.cpu_count() or 1) >= 2
    mock_port, proxy_port = free_port(), free_port()
    mock_argv = ["mock", "--port", str(mock_port), "--dialect", args.dialect]
    proxy_argv = ["serve", "--port", str(proxy_port), "--upstream-url", f"http://127.0.0.1:{mock_port}",
                  "--upstream-dialect", args.dialect, "--log-level", "warning"]
    if args.full_text:
        mock_argv.append("--full-text")
        proxy_argv.append("--full-text")
    bare_port = free_port()
    mock = start(mock_argv, 1 if two_cpus else None)
    proxy = start(proxy_argv, 0 if two_cpus else None)
    bare = start([os.path.join(os.path.dirname(__file__), "bare_relay.py"), str(bare_port),
                  f"http://127.0.0.1:{mock_port}"], 0 if two_cpus else None)
    try:
        await wait_up(f"http://127.0.0.1:{mock_port}/health")
        await wait_up(f"http://127.0.0.1:{proxy_port}/healthz")
        await wait_up(f"http://127.0.0.1:{bare_port}/")
        direct_url, proxy_url = f"http://127.0.0.1:{mock_port}", f"http://127.0.0.1:{proxy_port}"
        bare_url = f"http://127.0.0.1:{bare_port}"
        print(f"dialect={args.dialect} full_text={args.full_text} proxy pinned to CPU 0: {two_cpus}; "
              f"{seconds:g} s per run\n")
        print("ratio = proxy rps / direct rps; bare = the barest aiohttp relay (tests/bench/bare_relay.py), same "
              "pinning;\nCPU columns are the relay process's own CPU time (utime+stime) per request / per chunk.\n")
        header = (f"{'scenario':<18}{'conc':>5}{'direct rps':>11}{'proxy rps':>10}{'ratio':>7}{'bare':>6}"
                  f"{'p50 ms':>8}{'p99 ms':>8}{'d.p50':>7}{'ttfc ms':>8}{'cpu/req µs':>11}{'bare':>6}"
                  f"{'cpu/chunk µs':>13}{'bare':>6}{'err':>5}")
        print(header)
        print("-" * len(header))
        scenarios = [("non-stream", False, 0, 0), ("stream 64x0ms", True, 64, 0),
                     ("stream 64x5ms", True, 64, 5)]
        for name, stream, chunks, delay in scenarios:
            for conc in concurrencies:
                max_req = 200_000
                await load(direct_url, stream, chunks, delay, conc, 0.3, 500)  # warm-up
                d = await load(direct_url, stream, chunks, delay, conc, seconds, max_req)
                await load(proxy_url, stream, chunks, delay, conc, 0.3, 500)
                c0 = cpu_seconds(proxy.pid)
                p = await load(proxy_url, stream, chunks, delay, conc, seconds, max_req)
                cpu = cpu_seconds(proxy.pid) - c0
                await load(bare_url, stream, chunks, delay, conc, 0.3, 500)
                b0 = cpu_seconds(bare.pid)
                b = await load(bare_url, stream, chunks, delay, conc, seconds, max_req)
                bcpu = cpu_seconds(bare.pid) - b0
                per_req = cpu / max(len(p.latencies), 1) * 1e6
                per_chunk = cpu / max(p.chunks, 1) * 1e6
                b_req = bcpu / max(len(b.latencies), 1) * 1e6
                b_chunk = bcpu / max(b.chunks, 1) * 1e6
                ratio = p.rps / d.rps if d.rps else float("nan")
                b_ratio = b.rps / d.rps if d.rps else float("nan")
                ttfc = f"{pct(p.ttfb, 50) * 1000:8.2f}" if stream else f"{'-':>8}"
                chunk_cols = f"{per_chunk:>13.1f}{b_chunk:>6.0f}" if stream else f"{'-':>13}{'-':>6}"
                print(f"{name:<18}{conc:>5}{d.rps:>11.1f}{p.rps:>10.1f}{ratio:>7.2f}{b_ratio:>6.2f}"
                      f"{pct(p.latencies, 50) * 1000:>8.2f}{pct(p.latencies, 99) * 1000:>8.2f}"
                      f"{pct(d.latencies, 50) * 1000:>7.2f}{ttfc}{per_req:>11.0f}{b_req:>6.0f}"
                      f"{chunk_cols}{p.errors + d.errors + b.errors:>5}", flush=True)
        await client_dialects(proxy, proxy_url, seconds)
    finally:
        for proc in (proxy, bare, mock):
            proc.send_signal(signal.SIGINT)
        for proc in (proxy, bare, mock):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


async def client_dialects(proxy: subprocess.Popen[bytes], proxy_url: str, seconds: float, rounds: int = 3) -> None:
    """The same upstream streams through each client dialect: proxy CPU per upstream chunk, and its ratio to chat.
    The dialects take turns for `rounds` rounds and each keeps its lowest figure (the least disturbed run)."""
    print(f"\nclient dialects (the same 64-chunk zero-delay upstream streams, 16 concurrent; CPU per upstream chunk, "
          f"best of {rounds} alternating rounds)")
    header = f"{'client dialect':<18}{'rps':>10}{'cpu/chunk µs':>13}{'vs chat':>8}{'err':>5}"
    print(header)
    print("-" * len(header))
    best: dict[str, tuple[float, float]] = {}
    errors: dict[str, int] = {}
    for _ in range(rounds):
        for api in CLIENT_APIS:
            await load(proxy_url, True, 64, 0, 16, 0.3, 500, api)
            c0 = cpu_seconds(proxy.pid)
            p = await load(proxy_url, True, 64, 0, 16, seconds, 200_000, api)
            per_chunk = (cpu_seconds(proxy.pid) - c0) / max(len(p.latencies) * 64, 1) * 1e6
            if api not in best or per_chunk < best[api][1]:
                best[api] = (p.rps, per_chunk)
            errors[api] = errors.get(api, 0) + p.errors
    base = best["chat"][1]
    for api, (rps, per_chunk) in best.items():
        print(f"{api:<18}{rps:>10.1f}{per_chunk:>13.1f}{per_chunk / base:>8.2f}{errors[api]:>5}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
