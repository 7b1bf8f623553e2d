"""`--workers 2` against `--workers 1` on this machine's cores, with a load and an upstream as cheap as can be.

    python tests/bench/workers.py [--seconds 4] [--rounds 3] [--compiled]      (`make bench-workers`; docs/speed.md)

What a second worker gains can only be seen if the relay's workers get the cores. bench.py's load generator and mock
upstream are Python (aiohttp, uvicorn): on two cores they take about as much CPU per request as the relay they drive,
so a second worker has no core to run on. Here the upstream is nginx serving the built-in mock's own answers (one
non-stream answer and one 64-chunk stream, captured from `dialect-proxy mock` at the start and served as static
files) and the load is wrk, 64 keep-alive connections; both are C (Debian packages `nginx` and `wrk`). With a relay
between them they and the kernel's loopback still take 35-65 µs of CPU a request (the `rest/req` column; the
relays take 100-250 µs, compiled), which on two cores caps what a second worker can add (the printed ceiling).

For each scenario the proxy and the barest relay (tests/bench/bare_relay.py: uvicorn workers too) run with one and
with two worker processes, all four at once and idle but the one measured; they take turns for `--rounds` rounds
and each keeps its best. Printed per row: requests/s, the relay's CPU per request (all its processes), the rest
of the machine's CPU per request (wrk, nginx, the kernel's loopback work not charged to the relay: all busy CPU in
/proc/stat minus the relay's) and how the relay's CPU split over the workers (uvicorn's workers share one listening
socket: whichever accepts a connection keeps it), and the gain of two workers over one next to this machine's
ceiling for it: one worker can have a core to itself, two share the machine's cores with the load and the upstream,
so two workers reach at most cores / (relay + rest, per request at two workers) requests/s: printed as a ratio to
one worker's requests/s. Loopback only; every run bounded by `--seconds`. Not a test: it asserts
nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import aiohttp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench  # noqa: E402  (tests/bench/bench.py: process helpers)

CONNECTIONS = 64
REQUEST = {"model": "bench", "messages": [{"role": "user", "content": "bench [mock:chunks=64]"}]}
NGINX_CONF = bench.NGINX_HEAD + """\
  server {{
    listen 127.0.0.1:{plain};
    root {dir}/plain;
    default_type application/json;
    error_page 405 =200 $uri;  # a POST to a static file: answered with the file
  }}
  server {{
    listen 127.0.0.1:{stream};
    root {dir}/stream;
    default_type text/event-stream;
    error_page 405 =200 $uri;
  }}
}}
"""
WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{body}'
"""


def missing_tools() -> list[str]:
    return [tool for tool in ("nginx", "wrk") if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}")]


def capture_answers(workdir: str) -> None:
    """The built-in OpenAI mock's answers to the bench's request, non-stream and stream, as nginx's static files
    (`workdir`/plain and `workdir`/stream)."""
    port = bench.free_port()
    mock = bench.start(["mock", "--port", str(port), "--dialect", "openai"], None)
    try:
        answers = asyncio.run(fetch_answers(f"http://127.0.0.1:{port}"))
    finally:
        bench.stop(mock)
    for kind, answer in answers.items():
        os.makedirs(os.path.join(workdir, kind, "v1", "chat"), exist_ok=True)
        with open(os.path.join(workdir, kind, "v1", "chat", "completions"), "wb") as f:
            f.write(answer)


async def fetch_answers(mock: str) -> dict[str, bytes]:
    await bench.wait_up(mock + "/health")
    answers = {}
    async with aiohttp.ClientSession() as s:
        for kind, stream in (("plain", False), ("stream", True)):
            body = {**REQUEST, "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})}
            async with s.post(mock + "/v1/chat/completions", json=body) as r:
                answers[kind] = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"mock answered {r.status}: {answers[kind][:200]!r}")
    return answers


@dataclass
class Run:
    rps: float = 0.0
    cpu_us: float = float("nan")  # the relay's CPU per request, all its processes
    rest_us: float = float("nan")  # the rest of the machine's busy CPU per request (load, upstream, kernel)
    split: list[float] = field(default_factory=list)  # CPU seconds of each worker process in that run
    errors: str = ""


def wrk(url: str, script: str, seconds: int) -> tuple[float, str]:
    """Requests/s of one wrk run (whole seconds), and what it reported as errors ('' if none)."""
    done = subprocess.run(["wrk", "-t1", f"-c{CONNECTIONS}", f"-d{seconds}s", "-s", script, url],
                          capture_output=True, text=True, timeout=seconds + 30)
    out = done.stdout
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if rps is None:
        raise RuntimeError(f"wrk: {done.stderr or out}")
    errors = "; ".join(line.strip() for line in out.splitlines() if "Non-2xx" in line or "Socket errors" in line)
    return (float(rps.group(1)) if rps else 0.0), errors


def workers_of(pid: int) -> list[int]:
    return [k for k in bench.children(pid) if "resource_tracker" not in bench.cmdline(k)]


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle since boot (/proc/stat: user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def measure(proc: subprocess.Popen[bytes], url: str, script: str, seconds: int) -> Run:
    kids = workers_of(proc.pid)
    c0, k0 = bench.cpu_seconds(proc.pid), [bench.cpu_seconds(k) for k in kids]
    m0 = machine_busy_seconds()
    rps, errors = wrk(url, script, seconds)
    cpu = bench.cpu_seconds(proc.pid) - c0
    busy = machine_busy_seconds() - m0
    requests = rps * seconds
    return Run(rps, cpu / requests * 1e6 if requests else float("nan"),
               (busy - cpu) / requests * 1e6 if requests else float("nan"),
               [bench.cpu_seconds(k) - k0[i] for i, k in enumerate(kids)], errors)


def scale_workers(seconds: int, rounds: int, tree: str | None = None) -> None:
    """`tree`: a tree whose proxy to measure (bench.py --compiled: a compiled copy); None: this one."""
    missing = missing_tools()
    if missing:
        print(f"--scale workers needs {' and '.join(missing)} (Debian packages; `make bench-workers` installs them "
              "when run as root): skipped")
        return
    bench.pin_self(None)
    workdir = tempfile.mkdtemp(prefix="bench-workers-")
    os.chmod(workdir, 0o755)  # nginx's worker process runs as another user when started by root
    procs: list[subprocess.Popen[bytes]] = []
    try:
        capture_answers(workdir)
        plain_port, stream_port = bench.free_port(), bench.free_port()
        for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            os.makedirs(os.path.join(workdir, sub), exist_ok=True)
        conf = os.path.join(workdir, "nginx.conf")
        with open(conf, "w") as f:
            f.write(NGINX_CONF.format(dir=workdir, plain=plain_port, stream=stream_port))
        nginx = subprocess.Popen([shutil.which("nginx") or "/usr/sbin/nginx", "-c", conf, "-p", workdir],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(nginx)
        scripts = {}
        for kind, stream in (("non-stream", False), ("64-chunk stream", True)):
            scripts[kind] = os.path.join(workdir, f"{'stream' if stream else 'plain'}.lua")
            with open(scripts[kind], "w") as f:
                f.write(WRK_SCRIPT.format(body=json.dumps({**REQUEST, "stream": stream})))
        print(f"--workers 1 vs 2, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}: wrk "
              f"({CONNECTIONS} keep-alive connections) -> relay -> nginx serving the mock's answers; best of "
              f"{rounds} alternating rounds of {seconds} s")
        for kind, port in (("non-stream", plain_port), ("64-chunk stream", stream_port)):
            upstream = f"http://127.0.0.1:{port}"
            asyncio.run(bench.wait_up(upstream + "/"))
            relays: dict[tuple[str, int], tuple[subprocess.Popen[bytes], str]] = {}
            for workers in (1, 2):
                relay_port, bare_port = bench.free_port(), bench.free_port()
                relays[("proxy", workers)] = (bench.start(
                    ["serve", "--port", str(relay_port), "--upstream-url", upstream, "--upstream-dialect", "openai",
                     "--log-level", "warning", "--workers", str(workers),
                     # several workers need a shared state store (a memory one is refused); chat completions never
                     # touch it, so one that nothing serves is enough here
                     *(["--state-store", f"redis://127.0.0.1:{bench.free_port()}/0"] if workers > 1 else [])],
                    None, cwd=tree),
                    f"http://127.0.0.1:{relay_port}")
                relays[("bare", workers)] = (bench.start(
                    [os.path.join(HERE, "bare_relay.py"), str(bare_port), upstream, str(workers)], None),
                    f"http://127.0.0.1:{bare_port}")
            procs += [proc for proc, _ in relays.values()]
            for (target, _), (_proc, url) in relays.items():
                asyncio.run(bench.wait_up(url + ("/healthz" if target == "proxy" else "/")))
            direct = max(wrk(upstream + "/v1/chat/completions", scripts[kind], min(seconds, 2))[0]
                         for _ in range(2))
            best: dict[tuple[str, int], Run] = {}
            for _proc, url in relays.values():  # warm-up: connections, caches, the first requests' imports
                wrk(url + "/v1/chat/completions", scripts[kind], 1)
            for _ in range(rounds):
                for key, (proc, url) in relays.items():
                    run = measure(proc, url + "/v1/chat/completions", scripts[kind], seconds)
                    if bench.died(proc):
                        raise RuntimeError(bench.died(proc))
                    if run.rps > best.get(key, Run()).rps:
                        best[key] = run
            print(f"\n{kind} (direct, wrk -> nginx: {direct:,.0f} req/s)")
            print(f"  {'relay':6} {'workers':>7} {'req/s':>9} {'CPU/req':>9} {'rest/req':>9}  CPU split over the "
                  "workers")
            for (target, workers), run in sorted(best.items()):
                split = " / ".join(f"{100 * s / sum(run.split):.0f}%" for s in run.split) if sum(run.split) else "-"
                print(f"  {target:6} {workers:7} {run.rps:9,.0f} {run.cpu_us:7.0f} µs {run.rest_us:6.0f} µs  {split}"
                      + (f"  errors: {run.errors}" if run.errors else ""))
            cores = os.cpu_count() or 1
            for target in ("bare", "proxy"):
                one, two = best[(target, 1)], best[(target, 2)]
                ceiling = cores / ((two.cpu_us + two.rest_us) * 1e-6) / one.rps  # all cores busy at two workers
                print(f"  {target:6} 2 workers / 1: throughput {two.rps / one.rps:.2f}x (this machine's ceiling "
                      f"{ceiling:.2f}x), CPU per request {two.cpu_us / one.cpu_us:.2f}x")
            bench.stop(*(proc for proc, _ in relays.values()))
            procs = [nginx]
    finally:
        bench.stop(*(p for p in procs if p.poll() is None))
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=4, help="duration of each measured run (bounded)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; each relay keeps its best")
    ap.add_argument("--compiled", action="store_true", help="the proxy is a compiled copy of this tree (setup.py)")
    args = ap.parse_args()
    tree = bench.compiled_copy() if args.compiled else None
    print(f"dialect-proxy bench, {time.strftime('%Y-%m-%d %H:%M')}")
    try:
        scale_workers(args.seconds, args.rounds, tree)
    finally:
        if tree is not None:
            shutil.rmtree(tree, ignore_errors=True)


if __name__ == "__main__":
    main()
