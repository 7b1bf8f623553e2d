"""In-process micro benchmark of one request's metrics bookkeeping (proxy/metrics/definitions.py,
proxy/gateway/replicas.py).

    python tests/bench/micro_metrics.py [--rounds 7] [--multiprocess] [--profile SCENARIO]

Each scenario does what the handler (proxy/endpoint/inference.py) does to the metrics for one request:
`Metrics.request`, upstream_started/headers, one `chunk()` per event, usage, `upstream_up`, `finish`; a stream has 66
events (role, 64 tokens, finish). "replica acquire/release" is one attempt on a ReplicaSet: acquire a ticket,
`succeeded`, release (the admission gauges). `--multiprocess` runs the same in prometheus_client's multiprocess mode (a
temporary PROMETHEUS_MULTIPROC_DIR, as with `serve --workers N`): the updates are the same local ones, and it also times
a worker's write of its changed values to the mmap files (proxy/metrics/files.py, once a second per worker) after a
request of each scenario, and one with nothing changed. Prints µs per request: the
fastest over `rounds` alternating rounds (the machine is shared). Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

ROUTE = "/v1/chat/completions"
USAGE = {"prompt_tokens": 15, "completion_tokens": 64, "total_tokens": 79,
         "prompt_tokens_details": {"cached_tokens": 8}}


def scenarios(metrics: Any, replicas: Any) -> dict[str, Callable[[], None]]:
    def nonstream() -> None:
        obs = metrics.request(ROUTE, "bench", "m", False, key="k")
        obs.upstream_started()
        metrics.upstream_up("bench", True)
        obs.upstream_headers()
        obs.chunk(True)
        obs.usage(USAGE)
        obs.finish(200, False, "stop")

    def stream() -> None:
        obs = metrics.request(ROUTE, "bench", "m", True, key="k")
        obs.upstream_started()
        metrics.upstream_up("bench", True)
        obs.upstream_headers()
        obs.chunk(False)
        for _ in range(64):
            obs.chunk(True)
        obs.chunk(False)
        obs.usage(USAGE)
        obs.finish(200, False, "stop")

    loop = asyncio.new_event_loop()

    async def attempt() -> None:
        attempts = replicas.attempts({})
        ticket = await attempts.next()
        attempts.succeeded(ticket)
        ticket.release()

    def replica() -> None:
        loop.run_until_complete(attempt())

    async def nothing() -> None:
        return None

    def baseline() -> None:  # the event loop's own cost, to subtract from "replica acquire/release"
        loop.run_until_complete(nothing())

    return {"non-stream request": nonstream, "stream request (64 tokens)": stream,
            "replica acquire/release": replica, "(event loop baseline)": baseline}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--multiprocess", action="store_true")
    ap.add_argument("--profile", metavar="SCENARIO")
    args = ap.parse_args()
    if args.multiprocess:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="bench-metrics-")
    else:
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    # prometheus_client picks its value store when imported: only now (micro.py imports it too).
    from micro import measure  # tests/bench/micro.py, next to this script

    from proxy.dialects import get_dialect
    from proxy.gateway.redact import Redactor
    from proxy.gateway.replicas import ReplicaSet
    from proxy.metrics.definitions import Metrics
    from proxy.settings import ServerSettings, UpstreamSettings

    metrics = Metrics(["m"], multiprocess=args.multiprocess, key_names=["k"])
    upstream = UpstreamSettings(name="bench", dialect="openai", url="http://127.0.0.1:1")
    replicas = ReplicaSet(upstream, ServerSettings(), get_dialect("openai"), metrics, Redactor())
    table = scenarios(metrics, replicas)
    if args.profile:
        run = table[args.profile]
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(5000):
            run()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)
        return
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, run in table.items():
            us = measure(run, 1)
            best[name] = min(best.get(name, us), us)
    mode = "multiprocess (mmap files)" if args.multiprocess else "single process"
    print(f"metrics bookkeeping per request, {mode}, fastest of {args.rounds} alternating rounds")
    for name, us in best.items():
        print(f"{name:<30}{us:>8.2f} µs")
    if args.multiprocess:
        def changed() -> None:
            for run in table.values():
                run()
            metrics.flush_files()

        both = min(measure(changed, 1) for _ in range(args.rounds)) - sum(best.values())
        idle = min(measure(metrics.flush_files, 1) for _ in range(args.rounds))
        print(f"{'write to the files, changed':<30}{both:>8.2f} µs  (once a second per worker)")
        print(f"{'write to the files, unchanged':<30}{idle:>8.2f} µs")
    body = metrics.render()[0]
    print(f"(/metrics body {len(body)} bytes)")


if __name__ == "__main__":
    main()
