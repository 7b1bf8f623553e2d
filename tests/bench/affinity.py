"""Prefix-cache hit rate of a multi-turn workload through the gateway: least_outstanding vs prefix_affinity.

    python tests/bench/affinity.py [--replicas 4] [--conversations 96] [--turns 6] [--concurrency 16]

Starts N mock replicas and the proxy (as processes, loopback only) once per balancing strategy, and plays the same
workload each time: many conversations, each of several turns (system prompt + growing history, the client appends
the answer and its next question), interleaved with bounded concurrency. Each mock models an inference server's
prefix cache (proxy/mock/asgi.py PrefixCache: the longest run of leading messages an earlier request to the same
server began with) and reports cached vs total prompt characters; the hit rate is their ratio over all replicas.
It also prints how evenly the requests were spread. A benchmark, not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import tempfile

import aiohttp
import yaml

sys.path.insert(0, os.path.dirname(__file__))
from bench import free_port, start, wait_up  # noqa: E402

SYSTEM_PROMPTS = [
    "You are a careful assistant for the finance team. Answer briefly and cite the policy section. " * 4,
    "You are a coding assistant. Prefer small, tested changes and explain the why. " * 4,
    "You are a support agent for NPU servers. Ask for the MindIE version first. " * 4,
]


async def conversation(session: aiohttp.ClientSession, base: str, cid: int, turns: int, rng: random.Random) -> int:
    messages = [{"role": "system", "content": SYSTEM_PROMPTS[cid % len(SYSTEM_PROMPTS)]}]
    errors = 0
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Conversation {cid}, question {turn}: " + "details " * 20})
        async with session.post(base + "/v1/chat/completions", json={"model": "m", "messages": messages}) as r:
            if r.status != 200:
                errors += 1
                messages.pop()
                continue
            data = await r.json()
        messages.append({"role": "assistant", "content": data["choices"][0]["message"]["content"]})
        await asyncio.sleep(rng.random() * 0.01)  # the user reads and types; other conversations interleave
    return errors


async def run(strategy: str, mocks: list[str], args: argparse.Namespace) -> dict[str, float]:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "gateway.yaml")
        with open(config, "w") as f:  # noqa: ASYNC230 (a small file, before the run)
            yaml.safe_dump({"upstreams": [{"name": "npu", "dialect": "openai", "url": mocks, "balance": strategy,
                                           "health_interval": 0,
                                           **({"affinity_load": args.affinity_load} if args.affinity_load else {})}],
                            "server": {"port": port, "log_level": "warning"}}, f)
        proxy = start(["serve", "--config", config], None)
        try:
            base = f"http://127.0.0.1:{port}"
            await wait_up(base + "/healthz")
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                for m in mocks:
                    async with session.post(m + "/_mock/reset") as r:
                        await r.read()
                rng = random.Random(11)
                gate = asyncio.Semaphore(args.concurrency)

                async def one(cid: int) -> int:
                    async with gate:
                        return await conversation(session, base, cid, args.turns, rng)

                errors = sum(await asyncio.gather(*(one(c) for c in range(args.conversations))))
                stats = []
                for m in mocks:
                    async with session.get(m + "/_mock/prefix_cache") as r:
                        stats.append(await r.json())
                async with session.get(base + "/metrics") as r:
                    text = await r.text()
                decisions = {kind: sum(float(line.split()[-1]) for line in text.splitlines()
                                       if line.startswith("dialect_proxy_affinity_decisions_total")
                                       and f'result="{kind}"' in line) for kind in ("owner", "spill")}
        finally:
            proxy.send_signal(signal.SIGINT)
            proxy.wait(timeout=15)
    cached = sum(s["cached_chars"] for s in stats)
    total = sum(s["prompt_chars"] for s in stats)
    spread = [s["requests"] for s in stats]
    return {"hit_rate": cached / total if total else 0.0, "errors": errors, "spread": spread,  # type: ignore[dict-item]
            **decisions}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--conversations", type=int, default=96)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--affinity-load", type=float, default=None, help="the proxy's affinity_load (default 1.25)")
    args = ap.parse_args()
    ports = [free_port() for _ in range(args.replicas)]
    procs = [start(["mock", "--port", str(p), "--dialect", "openai"], None) for p in ports]
    mocks = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        for m in mocks:
            await wait_up(m + "/health")
        print(f"{args.replicas} replicas, {args.conversations} conversations x {args.turns} turns, "
              f"concurrency {args.concurrency}")
        for strategy, urls in (("least_outstanding", mocks), ("prefix_affinity", mocks),
                               ("one replica (upper bound)", mocks[:1])):
            result = await run(strategy.split()[0] if urls is mocks else "least_outstanding", urls, args)
            extra = (f"   owner/spill {result['owner']:.0f}/{result['spill']:.0f}"
                     if strategy == "prefix_affinity" else "")
            print(f"  {strategy:26s} prefix-cache hit rate {result['hit_rate']:6.1%}   requests per replica "
                  f"{result['spread']}   errors {result['errors']}{extra}", flush=True)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGINT)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except Exception:
                proc.kill()


if __name__ == "__main__":
    asyncio.run(main())
