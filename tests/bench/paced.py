"""The ratio table's 5 ms-paced row, round by round: CPU per chunk of nginx, the bare relay and the proxy next to the
system calls and wake-ups each made per chunk, to tell a change of work from the machine's noise.

    python tests/bench/paced.py [--rounds 6] [--api chat|responses|messages] [--compiled]

The paced rows of tests/bench/bench.py (64 concurrent streams of 64 chunks, 5 ms apart, through an OpenAI mock)
swing more from run to run than the others. Each round here runs nginx (the floor, when installed: master and
worker counted together), the bare relay then the proxy for 2 s under that load, as the ratio table does, and
prints for each: CPU time per chunk, the read and write system calls per chunk
(`syscr`/`syscw` of /proc/PID/io) and the wake-ups per chunk (voluntary context switches, /proc/PID/status: each a
return from an idle wait for the network). Equal counts in every round with a moving CPU time per chunk mean the
same work costing a different time. Linux only; loopback only; every run bounded in time and count. Not a test: it
asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench  # noqa: E402  (tests/bench/bench.py: the load generator, the relays, --compiled)


def counters(pid: int) -> tuple[int, int, int]:
    """(read calls, write calls, voluntary context switches) of a process and its children (nginx's worker) so far."""
    reads = writes = switches = 0
    for pid_ in [pid, *bench.children(pid)]:
        with open(f"/proc/{pid_}/io") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key == "syscr":
                    reads += int(value)
                elif key == "syscw":
                    writes += int(value)
        with open(f"/proc/{pid_}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches:"):
                    switches += int(line.split()[1])
    return reads, writes, switches


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--api", choices=sorted(bench.CLIENT_APIS), default="chat", help="the proxy's client dialect")
    ap.add_argument("--compiled", action="store_true", help="the proxy from a compiled copy of this tree")
    args = ap.parse_args()
    if args.compiled:
        bench.PROXY_TREE = bench.compiled_copy()
    bench.raise_fd_limit()
    bench.pin_self({1})  # with the mocks, as `bench.py --pin-load`
    up = bench.Upstream("openai", "openai", False)
    up.start()
    try:
        await up.ready()
        print(f"5 ms-paced row: 64 streams of 64 chunks, 2 s per run; proxy client dialect {args.api}; per chunk: "
              "CPU µs, reads, writes, wake-ups")
        procs = {"nginx": up.nginx, "bare": up.bare, "proxy": up.proxy}
        for n in range(args.rounds):
            cells = []
            for target, proc in procs.items():
                if proc is None:  # nginx not installed
                    continue
                api = args.api if target == "proxy" else "chat"
                await bench.load(up.urls[target], True, 64, 5, 64, 0.3, 200, api)  # warm-up, as measure_row
                c0, before = bench.cpu_seconds(proc.pid), counters(proc.pid)
                r = await bench.load(up.urls[target], True, 64, 5, 64, 2.0, 200_000, api)
                cpu, after = bench.cpu_seconds(proc.pid) - c0, counters(proc.pid)
                chunks = max(len(r.latencies) * 64, 1)
                reads, writes, wakes = ((a - b) / chunks for a, b in zip(after, before, strict=True))
                cells.append(f"{target:<5} {cpu / chunks * 1e6:5.1f} µs {reads:5.2f} {writes:5.2f} {wakes:5.2f}"
                             f"{f'  err {r.errors}' if r.errors else ''}")
            print(f"round {n}: " + "  |  ".join(cells), flush=True)
    finally:
        up.stop()
        if bench.PROXY_TREE is not None:
            shutil.rmtree(bench.PROXY_TREE, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
