"""The ratio table's 5 ms-paced row, round by round: CPU per chunk of nginx, the bare relay and the proxy next to the
system calls and wake-ups each made per chunk, to tell a change of work from the machine's noise.

    python tests/bench/paced.py [--rounds 6] [--api chat|responses|messages] [--compiled] [--seconds 2]
    python tests/bench/paced.py --non-stream [...]      the non-stream row (16 concurrent), per request

The paced rows of tests/bench/bench.py (64 concurrent streams of 64 chunks, 5 ms apart, through an OpenAI mock)
swing more from run to run than the others. Each round here runs nginx (the floor, when installed: master and
worker counted together), the bare relay then the proxy for 2 s under that load, as the ratio table does, and
prints for each: CPU time per chunk, the read and write system calls per chunk
(`syscr`/`syscw` of /proc/PID/io) and the wake-ups per chunk (voluntary context switches, /proc/PID/status: each a
return from an idle wait for the network). /proc/PID/io counts only read(2)/readv and write(2)/writev, not
recv/send (nginx reads its sockets with recv): with `perf` (Debian package linux-perf) each round also counts every
system call per chunk from the kernel's tracepoints — all, the reads (read, readv, recvfrom, recvmsg), the writes
(write, writev, sendto, sendmsg) and the epoll waits. Equal counts in every round with a moving CPU time per chunk
mean the same work costing a different time. Each CPU figure also gives its share spent in the kernel (system
time, /proc/PID/stat): nginx's CPU is mostly the kernel's loopback TCP work, which every relay pays alike. Linux
only; loopback only; every run bounded in time and count. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench  # noqa: E402  (tests/bench/bench.py: the load generator, the relays, --compiled)


def user_system(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process and its children so far (/proc/PID/stat, clock ticks)."""
    tick = os.sysconf("SC_CLK_TCK")
    user = system = 0.0
    for pid_ in [pid, *bench.children(pid)]:
        with open(f"/proc/{pid_}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        user += int(fields[11]) / tick
        system += int(fields[12]) / tick
    return user, system


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


READS = ("read", "readv", "recvfrom", "recvmsg")
WRITES = ("write", "writev", "sendto", "sendmsg")
WAITS = ("epoll_wait", "epoll_pwait", "epoll_pwait2")
PERF_EVENTS = ",".join(["raw_syscalls:sys_enter", *(f"syscalls:sys_enter_{n}" for n in (*READS, *WRITES, *WAITS))])


def perf_start(pids: list[int]) -> tuple[subprocess.Popen[bytes], str] | None:
    """`perf stat` counting the system calls of `pids` until perf_stop; None without perf."""
    if shutil.which("perf") is None:
        return None
    fd, out = tempfile.mkstemp(prefix="bench-perf-")
    os.close(fd)
    proc = subprocess.Popen(["perf", "stat", "-x", ",", "-o", out, "-e", PERF_EVENTS, "-p",
                             ",".join(map(str, pids))], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, out


def perf_stop(started: tuple[subprocess.Popen[bytes], str] | None) -> dict[str, int]:
    """{'all', 'reads', 'writes', 'waits'} system calls counted since perf_start."""
    if started is None:
        return {}
    proc, out = started
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    counts: dict[str, int] = {}
    with open(out) as f:
        for line in f:
            parts = line.strip().split(",")
            if len(parts) > 2 and parts[0].isdigit():
                counts[parts[2].split(":")[-1].removeprefix("sys_enter_")] = int(parts[0])
    os.unlink(out)
    return {"all": counts.get("sys_enter", 0), "reads": sum(counts.get(n, 0) for n in READS),
            "writes": sum(counts.get(n, 0) for n in WRITES), "waits": sum(counts.get(n, 0) for n in WAITS)}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--api", choices=sorted(bench.CLIENT_APIS), default="chat", help="the proxy's client dialect")
    ap.add_argument("--compiled", action="store_true", help="the proxy from a compiled copy of this tree")
    ap.add_argument("--non-stream", action="store_true", help="the non-stream row instead (16 concurrent; per request)")
    ap.add_argument("--seconds", type=float, default=2.0, help="per run (CPU ticks are 10 ms: longer runs split"
                    " user and system time finer)")
    args = ap.parse_args()
    if args.compiled:
        bench.PROXY_TREE = bench.compiled_copy()
    bench.raise_fd_limit()
    bench.pin_self({1})  # with the mocks, as `bench.py --pin-load`
    up = bench.Upstream("openai", "openai", False)
    up.start()
    try:
        await up.ready()
        row = "non-stream row: 16 concurrent, per request" if args.non_stream else \
            "5 ms-paced row: 64 streams of 64 chunks, per chunk"
        print(f"{row}, {args.seconds:g} s per run; proxy client dialect {args.api}: CPU µs (its system share), reads,"
              " writes, wake-ups (/proc); with perf: all system calls, reads, writes, epoll waits")
        procs = {"nginx": up.nginx, "bare": up.bare, "proxy": up.proxy}
        for n in range(args.rounds):
            cells = []
            for target, proc in procs.items():
                if proc is None:  # nginx not installed
                    continue
                api = args.api if target == "proxy" else "chat"
                await bench.load(up.urls[target], not args.non_stream, 64, 5, 64, 0.3, 200, api)  # warm-up
                perf = perf_start([proc.pid, *bench.children(proc.pid)])
                await asyncio.sleep(0.3)  # perf attached
                c0, before, us0 = bench.cpu_seconds(proc.pid), counters(proc.pid), user_system(proc.pid)
                if args.non_stream:
                    r = await bench.load(up.urls[target], False, 16, 0, 16, args.seconds, 200_000, api)
                else:
                    r = await bench.load(up.urls[target], True, 64, 5, 64, args.seconds, 200_000, api)
                cpu, after, us1 = bench.cpu_seconds(proc.pid) - c0, counters(proc.pid), user_system(proc.pid)
                chunks = max(len(r.latencies) * (1 if args.non_stream else 64), 1)
                user, system = us1[0] - us0[0], us1[1] - us0[1]
                kernel = f" (system {system / max(user + system, 1e-9):4.0%})"
                calls = {k: v / chunks for k, v in perf_stop(perf).items()}
                reads, writes, wakes = ((a - b) / chunks for a, b in zip(after, before, strict=True))
                syscalls = (f" | syscalls {calls['all']:4.2f}: reads {calls['reads']:4.2f}"
                            f" writes {calls['writes']:4.2f} epoll {calls['waits']:4.2f}") if calls else ""
                cells.append(f"{target:<5} {cpu / chunks * 1e6:5.1f} µs{kernel} {reads:5.2f} {writes:5.2f} {wakes:5.2f}"
                             f"{syscalls}{f'  err {r.errors}' if r.errors else ''}")
            print(f"round {n}:\n  " + "\n  ".join(cells), flush=True)
    finally:
        up.stop()
        if bench.PROXY_TREE is not None:
            shutil.rmtree(bench.PROXY_TREE, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
