"""Gateway soak: traffic through the proxy while its replicas go down and come back, for a bounded time.

    python tests/bench/gateway_soak.py [--seconds 60] [--concurrency 16] [--period 3]

Starts three mock MindIE replicas and the proxy (processes, loopback only). Replica 0 stays up; every `period`
seconds a chaos step hits replica 1 or 2 with one of: SIGKILL (restarted on the same port a period later), answering
503 (MindIE busy), hanging before the headers, failing its health check. Meanwhile `concurrency` clients send short
streamed and non-streamed requests. Expected: every request succeeds, except one whose replica was killed after it
had started answering (the proxy never retries then: the client gets the cut, an error event or a 502 `closed the
connection in the middle`). Afterwards the in-flight, replica in-flight and queue gauges must be 0 and the request
counter must equal the requests sent. Prints retries, ejections and attempts per result. Exits non-zero otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import aiohttp
import yaml

sys.path.insert(0, os.path.dirname(__file__))
from bench import free_port, start, wait_up  # noqa: E402

CUT = (b"upstream connection broke", b"closed the connection in the middle")


def metric_sum(text: str, name: str, *must: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name) and all(m in line for m in must))


async def one(session: aiohttp.ClientSession, base: str, stream: bool, i: int) -> str:
    """'ok', 'cut' (the replica died mid-answer: expected), or a description of a wrong answer."""
    body = {"model": "m", "stream": stream,
            "messages": [{"role": "user", "content": f"request {i} [mock:chunks=12,delay_ms=10]"}]}
    async with session.post(base + "/v1/chat/completions", json=body) as r:
        raw = await r.read()
        if r.status != 200:
            return "cut" if r.status == 502 and any(c in raw for c in CUT) else f"status {r.status}: {raw[:160]!r}"
        if not stream:
            return "ok" if b"tok11" in raw else f"incomplete: {raw[:160]!r}"
        if raw.rstrip().endswith(b"data: [DONE]"):
            return "ok"
        return "cut" if any(c in raw for c in CUT) else f"stream ended with {raw[-160:]!r}"


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--period", type=float, default=3.0)
    args = ap.parse_args()
    ports = [free_port() for _ in range(3)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    proxy_port = free_port()

    def mock(i: int) -> subprocess.Popen[bytes]:
        return start(["mock", "--port", str(ports[i]), "--dialect", "mindie", "--full-text"], None)

    mocks = [mock(i) for i in range(3)]
    tmp = tempfile.mkdtemp()
    config = os.path.join(tmp, "gateway.yaml")
    with open(config, "w") as f:  # noqa: ASYNC230 (a small file, before the run)
        yaml.safe_dump({"upstreams": [{
            "name": "npu", "dialect": "mindie", "full_text": True, "retries": 2, "outlier_failures": 2,
            "outlier_backoff": 1, "outlier_backoff_max": 5, "health_interval": 1,
            "url": [{"url": u, "name": f"r{i}", "health_url": u + "/health"} for i, u in enumerate(urls)]}],
            "server": {"port": proxy_port, "log_level": "warning", "first_byte_timeout": 2}}, f)
    proxy = start(["serve", "--config", config], None)
    base = f"http://127.0.0.1:{proxy_port}"
    results: dict[str, int] = {"ok": 0, "cut": 0}
    wrong: list[str] = []
    events: list[str] = []
    issued = 0
    try:
        for u in urls:
            await wait_up(u + "/health")
        await wait_up(base + "/healthz")
        stop_at = time.monotonic() + args.seconds
        rng = random.Random(5)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            async def directives(i: int, text: str) -> None:
                async with session.post(urls[i] + "/_mock/directives", json={"directives": text}) as r:
                    await r.read()

            async def chaos() -> None:
                while time.monotonic() + 2 * args.period < stop_at:
                    i = rng.choice((1, 2))
                    action = rng.choice(("kill", "503", "hang", "unhealthy"))
                    events.append(f"r{i}:{action}")
                    if action == "kill":
                        mocks[i].kill()
                        mocks[i].wait()
                        await asyncio.sleep(args.period)
                        mocks[i] = mock(i)
                        await wait_up(urls[i] + "/health")
                    else:
                        await directives(i, {"503": "error=503", "hang": "hang=30"}.get(action, action))
                        await asyncio.sleep(args.period)
                        await directives(i, "")
                    await asyncio.sleep(args.period / 2)

            async def worker(w: int) -> None:
                nonlocal issued
                while time.monotonic() < stop_at:
                    issued += 1
                    n = issued
                    try:
                        outcome = await one(session, base, n % 2 == 0, n)
                    except (TimeoutError, aiohttp.ClientError) as e:
                        outcome = f"{type(e).__name__}: {e}"
                    if outcome in results:
                        results[outcome] += 1
                    elif len(wrong) < 50:
                        wrong.append(outcome)

            async def progress() -> None:
                t0 = time.monotonic()
                while time.monotonic() < stop_at:
                    await asyncio.sleep(min(10.0, args.seconds / 6))
                    print(f"t={time.monotonic() - t0:5.1f}s requests={issued} ok={results['ok']} "
                          f"cut={results['cut']} wrong={len(wrong)} chaos={events[-3:]}", flush=True)

            await asyncio.gather(chaos(), progress(), *(worker(w) for w in range(args.concurrency)))
            await asyncio.sleep(1.0)
            async with session.get(base + "/metrics") as r:
                text = await r.text()
    finally:
        for proc in (proxy, *mocks):
            proc.send_signal(signal.SIGINT)
        for proc in (proxy, *mocks):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
    counted = metric_sum(text, "dialect_proxy_requests_total")
    gauges = {name: metric_sum(text, name) for name in ("dialect_proxy_in_flight_requests",
                                                        "dialect_proxy_replica_in_flight",
                                                        "dialect_proxy_replica_queue_length")}
    attempts = {res: metric_sum(text, "dialect_proxy_upstream_attempts_total", f'result="{res}"')
                for res in ("ok", "unreachable", "timeout", "bad_gateway", "unavailable")}
    print(f"\nchaos steps: {len(events)} ({', '.join(events)})")
    print(f"requests {issued}: ok {results['ok']}, cut after the first byte {results['cut']}, wrong {len(wrong)}")
    print(f"retries {metric_sum(text, 'dialect_proxy_retries_total'):.0f}, ejections "
          f"{metric_sum(text, 'dialect_proxy_replica_ejections_total'):.0f}, attempts by result "
          f"{ {k: int(v) for k, v in attempts.items()} }")
    verdict = 0
    if wrong:
        print("wrong answers, first ones:", *wrong[:10], sep="\n  ")
        verdict = 1
    if counted != issued:
        print(f"requests counted by the proxy {counted:.0f} != sent {issued}")
        verdict = 1
    if any(gauges.values()):
        print(f"gauges left after the run (should be 0): {gauges}")
        verdict = 1
    print("gateway soak:", "OK" if verdict == 0 else "FAILED")
    return verdict


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
