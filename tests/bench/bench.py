"""Benchmark: the proxy against the floor (nginx), the barest Python relay and the mock upstream direct, in one run.

    python tests/bench/bench.py [--seconds 2] [--rounds 4] [--quick]      the ratio table (`make bench`)
    python tests/bench/bench.py --ref COMMIT [--quick]      ... with another commit's proxy in the same rounds
    python tests/bench/bench.py --compiled [--ref HEAD]     ... the proxy being a compiled copy of this tree (setup.py)
    python tests/bench/bench.py --scale streams|memory|fulltext|workers|all   one scale scenario (docs/speed.md)

Starts the built-in mocks (an OpenAI upstream and a MindIE full-text upstream), a proxy in front of each, the
barest aiohttp relay (tests/bench/bare_relay.py) in front of each and nginx (Debian package) as a plain reverse proxy
in front of each — one worker, keep-alive upstream connections, buffering off: a C relay doing no translation, the
floor for any relay on this machine —, as separate processes on loopback: relays pinned to CPU 0, mocks to CPU 1
when the machine has two. This process (the load generator, aiohttp) runs on either CPU
for the ratio table, so the relay under test is driven to saturation, where its CPU per unit is its own work;
`--pin-load` (and every scale scenario but `workers`) pins it to CPU 1 with the mocks instead: the relay then has a
core to itself and is measured at the load the mock and the load generator can offer on theirs, wake-ups included
(the direct runs get the same CPU for the mock and the load as the relayed ones).

The ratio table has one row per upstream dialect x client dialect x scenario (non-stream; 64-chunk streams
zero-delay and 5 ms-paced). For each row the direct mock, the bare relay and the proxy take turns for `--rounds`
rounds and each keeps its best round (the machine may be shared: the least disturbed round shows the code's own
cost). CPU is the relay process's own CPU time (from /proc schedstat, ns) per upstream chunk (64 per stream) or per
non-stream request; `ratio` is proxy CPU / bare CPU, `x nginx` proxy CPU / nginx CPU; `tput` is requests/s
relative to direct. With `--ref`, `proxy/ref` compares the two trees' best rounds and `by round` gives the
median, smallest and largest ratio of one round's two adjacent runs: the spread the proxy/ref figure carries on this
machine (docs/speed.md "CPU time"); every other round runs the relays in the opposite order, so that neither tree
always runs right after the other. After the table, each relay's resident memory after the rounds (warm: pools
grown, every code path run). Without nginx installed its columns are left out (`make bench` installs it when root).
Every run is bounded in time and count. Not a test: it asserts nothing.

A client dialect is one entry of CLIENT_APIS (path + request body of one prompt: chat, responses, messages);
adding one adds its rows.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

HERE = os.path.dirname(os.path.abspath(__file__))
TWO_CPUS = (os.cpu_count() or 1) >= 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """CPU time of a process (all its threads and, for `--workers`, its child processes), in seconds, from the
    scheduler's nanosecond counters."""
    total = 0
    for pid_ in [pid, *children(pid)]:
        for path in glob.glob(f"/proc/{pid_}/task/*/schedstat"):
            try:
                with open(path) as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass  # a thread that ended
    return total / 1e9


def children(pid: int) -> list[int]:
    out = []
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(path) as f:
                out += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def start(argv: list[str], cpu: int | set[int] | None, cwd: str | None = None) -> subprocess.Popen[bytes]:
    """`python -m proxy ARGV`, or a script when ARGV[0] ends in .py; pinned to `cpu` (one or a set). `cwd`: a tree
    whose `proxy` package to run (`python -m` imports from the working directory first)."""
    cpus = {cpu} if isinstance(cpu, int) else cpu

    def pin() -> None:
        if cpus is not None and TWO_CPUS and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cpus)

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, *argv] if argv[0].endswith(".py") else [sys.executable, "-m", "proxy", *argv]
    log = tempfile.TemporaryFile()  # stderr, shown by `died()` if the process ends early
    if cwd is None and argv[0] == "serve":
        cwd = PROXY_TREE
    proc = subprocess.Popen(cmd, preexec_fn=pin, env=env, stdout=subprocess.DEVNULL, stderr=log, cwd=cwd)
    LOGS[proc.pid] = log
    return proc


LOGS: dict[int, Any] = {}


def export_ref(ref: str) -> str:
    """The repository's tree at `ref` in a temporary directory (git archive), for `--ref`."""
    out = tempfile.mkdtemp(prefix="bench-ref-")
    root = os.path.dirname(os.path.dirname(HERE))
    archive = subprocess.run(["git", "-C", root, "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", out], input=archive, check=True)
    return out


def compiled_copy() -> str:
    """A compiled copy of this tree in a temporary directory (tests/compiled_tree.py, setup.py), for `--compiled`."""
    sys.path.insert(0, os.path.dirname(HERE))
    import compiled_tree  # tests/compiled_tree.py

    return compiled_tree.build(tempfile.mkdtemp(prefix="bench-compiled-"))


REF_TREE: str | None = None  # --ref: the other commit's tree; its proxy is measured next to this one's
PROXY_TREE: str | None = None  # --compiled: a compiled copy of this tree (tests/compiled_tree.py) is "proxy"


PINNED_LOAD = False


def pin_self(cpus: set[int] | None) -> None:
    """Pin this process (the load generator) to `cpus`; None: every CPU."""
    global PINNED_LOAD
    PINNED_LOAD = cpus is not None
    if TWO_CPUS and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus if cpus is not None else set(range(os.cpu_count() or 1)))


def died(proc: subprocess.Popen[bytes] | None) -> str:
    """'' while `proc` runs; else its exit status and the end of its stderr."""
    if proc is None or proc.poll() is None:
        return ""
    log = LOGS.get(proc.pid)
    tail = b""
    if log is not None:
        log.seek(0)
        tail = log.read()[-2000:]
    return f"process {proc.args} ended with {proc.returncode}:\n{tail.decode(errors='replace')}"


async def wait_up(url: str, timeout: float = 20) -> None:
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


def stop(*procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def raise_fd_limit(want: int = 16384) -> None:
    """Thousands of loopback connections need file descriptors (children inherit the limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


# nginx's process and http settings for a benchmark: one worker, in the foreground, its files under {dir}, no access
# log, keep-alive without a request limit (tests/bench/workers.py serves files with the same head).
NGINX_HEAD = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_requests 100000000;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
"""
NGINX_RELAY_CONF = NGINX_HEAD + """\
  upstream mock {{
    server 127.0.0.1:{upstream};
    keepalive 64;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://mock;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""


TEMP_DIRS: list[str] = []  # the nginx relays' working directories and the OTLP sink's, removed at exit


def nginx_binary() -> str | None:
    return shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)


def start_nginx(port: int, upstream: int, cpu: int) -> subprocess.Popen[bytes] | None:
    """nginx relaying 127.0.0.1:`port` to the mock on `upstream`, its master and worker pinned to `cpu`; None
    when nginx is not installed."""
    binary = nginx_binary()
    if binary is None:
        return None
    workdir = tempfile.mkdtemp(prefix="bench-nginx-")
    TEMP_DIRS.append(workdir)
    os.chmod(workdir, 0o755)  # nginx's worker process runs as another user when started by root
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        os.makedirs(os.path.join(workdir, sub), exist_ok=True)
    conf = os.path.join(workdir, "nginx.conf")
    with open(conf, "w") as f:
        f.write(NGINX_RELAY_CONF.format(dir=workdir, port=port, upstream=upstream))

    def pin() -> None:
        if TWO_CPUS and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {cpu})

    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([binary, "-c", conf, "-p", workdir], preexec_fn=pin, stdout=subprocess.DEVNULL,
                            stderr=log)
    LOGS[proc.pid] = log
    return proc


def tree_rss_kib(pid: int) -> int:
    """Resident memory of a process and its children (nginx's master and worker; a relay's workers)."""
    return sum(rss_kib(p) for p in [pid, *children(pid)])


# --otel: an OTLP/HTTP receiver that takes every export and keeps nothing (the proxy's exporters only read the status).
OTLP_SINK = """import sys
from aiohttp import web

async def take(request):
    await request.read()
    return web.Response(body=b"", content_type="application/x-protobuf")

app = web.Application()
app.router.add_post("/v1/traces", take)
app.router.add_post("/v1/metrics", take)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


async def start_otlp_sink() -> subprocess.Popen[bytes]:
    """An OTLP receiver on CPU 1 (with the mocks), and the standard OTEL_* variables that point every proxy started
    after it at it (docs/observability.md): tracing and the GenAI metrics on, all spans sampled."""
    path = os.path.join(tempfile.mkdtemp(prefix="bench-otlp-"), "otlp_sink.py")
    TEMP_DIRS.append(os.path.dirname(path))
    with open(path, "w") as f:  # noqa: ASYNC230 (before any load: nothing waits on this loop)
        f.write(OTLP_SINK)
    port = free_port()
    proc = start([path, str(port)], 1)
    os.environ.update({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
                       "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_SERVICE_NAME": "dialect-proxy-bench"})
    await wait_up(f"http://127.0.0.1:{port}/")
    return proc


@dataclass
class Result:
    latencies: list[float] = field(default_factory=list)
    ttfb: list[float] = field(default_factory=list)
    chunks: int = 0
    errors: int = 0
    elapsed: float = 0.0
    error_kinds: dict[str, int] = field(default_factory=dict)  # "HTTP 502", "ServerDisconnectedError" ...

    def error(self, kind: str) -> None:
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed else 0.0


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


# Client dialects: the path and the request body of one prompt (the same upstream request for each). The bare relay
# and the direct mock always get the chat request (they translate nothing).
CLIENT_APIS: dict[str, tuple[str, Callable[[str, bool], dict[str, Any]]]] = {
    "chat": ("/v1/chat/completions", lambda text, stream: {
        "model": "bench", "stream": stream, "messages": [{"role": "user", "content": text}]}),
    "responses": ("/v1/responses", lambda text, stream: {
        "model": "bench", "stream": stream, "store": False, "input": text}),
    "messages": ("/v1/messages", lambda text, stream: {
        "model": "bench", "stream": stream, "max_tokens": 1024, "messages": [{"role": "user", "content": text}]}),
}
# What counts as one client event in a streamed answer (chat chunks, Responses events, Messages events).
EVENT_MARK = b"data: {"


async def load(base: str, stream: bool, chunks: int, delay_ms: int, concurrency: int, seconds: float,
               max_requests: int, api: str = "chat", extra: dict[str, Any] | None = None) -> Result:
    directive = f"[mock:chunks={chunks}][mock:delay_ms={delay_ms}]" if stream else f"[mock:chunks={chunks}]"
    if chunks > 512:
        directive += f"[mock:max_iter={chunks}]"  # MindIE's default maxIterTimes is 512
    path, make = CLIENT_APIS[api]
    body = {**make("bench " + directive, stream), **(extra or {})}
    res = Result()
    stop_at = time.monotonic() + seconds
    issued = 0
    conn = aiohttp.TCPConnector(limit=concurrency + 4)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=max(60, seconds * 2))) as s:
        async def worker() -> None:
            nonlocal issued
            while time.monotonic() < stop_at and issued < max_requests:
                issued += 1
                t0 = time.perf_counter()
                try:
                    async with s.post(base + path, json=body) as r:
                        if r.status != 200:
                            res.error(f"HTTP {r.status}")
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
                                found = buf.count(EVENT_MARK)
                                if found and not n:
                                    res.ttfb.append(time.perf_counter() - t0)
                                n += found
                                tail = buf[-6:]
                            res.chunks += n
                        else:
                            await r.read()
                            res.chunks += 1
                except (TimeoutError, aiohttp.ClientError) as e:
                    res.error(type(e).__name__)
                    continue
                res.latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        res.elapsed = time.perf_counter() - t0
    return res


# ----------------------------------------------------------------------------------------------- the ratio table

@dataclass
class Upstream:
    """One mock upstream with a proxy and a bare relay in front of it."""

    name: str
    dialect: str
    full_text: bool
    mock: subprocess.Popen[bytes] | None = None
    proxy: subprocess.Popen[bytes] | None = None
    bare: subprocess.Popen[bytes] | None = None
    ref: subprocess.Popen[bytes] | None = None
    nginx: subprocess.Popen[bytes] | None = None
    urls: dict[str, str] = field(default_factory=dict)

    def start(self, proxy_extra: tuple[str, ...] = (), proxy_cpu: int | set[int] | None = 0) -> None:
        mock_port, proxy_port, bare_port = free_port(), free_port(), free_port()
        ft = ["--full-text"] if self.full_text else []
        self.mock = start(["mock", "--port", str(mock_port), "--dialect", self.dialect, *ft], 1)
        self.proxy = start(["serve", "--port", str(proxy_port), "--upstream-url", f"http://127.0.0.1:{mock_port}",
                            "--upstream-dialect", self.dialect, "--log-level", "warning", *ft, *proxy_extra],
                           proxy_cpu)
        self.bare = start([os.path.join(HERE, "bare_relay.py"), str(bare_port), f"http://127.0.0.1:{mock_port}"], 0)
        self.urls = {"direct": f"http://127.0.0.1:{mock_port}", "proxy": f"http://127.0.0.1:{proxy_port}",
                     "bare": f"http://127.0.0.1:{bare_port}"}
        nginx_port = free_port()
        self.nginx = start_nginx(nginx_port, mock_port, 0)
        if self.nginx is not None:
            self.urls["nginx"] = f"http://127.0.0.1:{nginx_port}"
        if REF_TREE is not None:
            ref_port = free_port()
            self.ref = start(["serve", "--port", str(ref_port), "--upstream-url", f"http://127.0.0.1:{mock_port}",
                              "--upstream-dialect", self.dialect, "--log-level", "warning", *ft, *proxy_extra],
                             proxy_cpu, cwd=REF_TREE)
            self.urls["ref"] = f"http://127.0.0.1:{ref_port}"

    async def ready(self) -> None:
        await wait_up(self.urls["direct"] + "/health")
        await wait_up(self.urls["proxy"] + "/healthz")
        await wait_up(self.urls["bare"] + "/")
        if "nginx" in self.urls:
            await wait_up(self.urls["nginx"] + "/health")
        if "ref" in self.urls:
            await wait_up(self.urls["ref"] + "/healthz")

    def stop(self) -> None:
        stop(*(p for p in (self.proxy, self.ref, self.bare, self.nginx, self.mock) if p is not None))

    def pids(self) -> dict[str, int]:
        """The relays' process ids by target name."""
        procs = {"bare": self.bare, "proxy": self.proxy, "ref": self.ref, "nginx": self.nginx}
        return {name: proc.pid for name, proc in procs.items() if proc is not None}


@dataclass
class Best:
    rps: float = 0.0
    p50: float = float("nan")
    errors: int = 0
    rounds: list[float] = field(default_factory=list)  # µs per unit in each round, in order

    @property
    def cpu(self) -> float:
        """µs per unit in the least disturbed round."""
        return min(self.rounds, default=float("inf"))


def paired_range(proxy: Best, ref: Best) -> tuple[float, float, float]:
    """The smallest, median and largest proxy/ref ratio of one round's two adjacent runs: how far apart the same two
    trees read within this table, the spread a proxy/ref figure carries."""
    ratios = sorted(p / r for p, r in zip(proxy.rounds, ref.rounds, strict=False) if r)
    if not ratios:
        return float("nan"), float("nan"), float("nan")
    return ratios[0], statistics.median(ratios), ratios[-1]


async def measure_row(up: Upstream, api: str, stream: bool, delay: int, conc: int, seconds: float,
                      rounds: int) -> dict[str, Best]:
    chunks = 64 if stream else 16
    targets = [t for t in ("direct", "nginx", "bare", "proxy", "ref") if t in up.urls]
    best = {target: Best() for target in targets}
    pids = up.pids()
    for n in range(rounds):
        # Every other round in the opposite order: a relay's place in the round (what ran on its CPU just before it)
        # then weighs on both sides of a ratio alike.
        for target in targets if n % 2 == 0 else targets[::-1]:
            target_api = api if target in ("proxy", "ref") else "chat"
            url = up.urls[target]
            await load(url, stream, chunks, delay, conc, 0.3, 200, target_api)  # warm-up
            c0 = cpu_seconds(pids[target]) if target in pids else 0.0
            r = await load(url, stream, chunks, delay, conc, seconds, 200_000, target_api)
            cpu = cpu_seconds(pids[target]) - c0 if target in pids else 0.0
            units = len(r.latencies) * (chunks if stream else 1)
            b = best[target]
            b.errors += r.errors
            if r.rps > b.rps:
                b.rps, b.p50 = r.rps, pct(r.latencies, 50)
            if target in pids and units:
                b.rounds.append(cpu / units * 1e6)
    return best


async def ratio_table(seconds: float, rounds: int) -> None:
    ups = [Upstream("openai", "openai", False), Upstream("mindie full-text", "mindie", True)]
    for up in ups:
        up.start()
    try:
        for up in ups:
            await up.ready()
        floor = "nginx" in ups[0].urls
        load = "CPU 1 with the mocks" if PINNED_LOAD else "either CPU"
        print(f"relays pinned to CPU 0, mocks to CPU 1: {TWO_CPUS}; load generator on {load}; {seconds:g} s per run, "
              f"best of {rounds} alternating rounds (direct, {'nginx, ' if floor else ''}bare, proxy"
              f"{', ref' if REF_TREE else ''})\n")
        print("cpu = the relay process's CPU time per upstream chunk (64 per stream) or per non-stream request;\n"
              "ratio = proxy cpu / bare cpu; x nginx = proxy cpu / nginx cpu; tput = requests/s relative to the mock "
              "direct.\n")
        if not floor:
            print("nginx is not installed (Debian package `nginx`): no floor columns.\n")
        header = f"{'upstream':<17}{'client':<11}{'scenario':<15}{'conc':>5}"
        header += f"{'nginx µs':>9}" if floor else ""
        header += f"{'bare µs':>9}{'proxy µs':>10}{'ratio':>7}"
        header += f"{'x nginx':>8}" if floor else ""
        header += f"{'bare tput':>10}{'proxy tput':>11}{'p50 ms':>8}{'err':>5}"
        if REF_TREE is not None:
            header += f"{'ref µs':>9}{'ref ratio':>10}{'proxy/ref':>10}{'by round: median (range)':>26}"
        print(header)
        print("-" * len(header))
        scenarios = [("non-stream", False, 0, 16), ("stream 64x0ms", True, 0, 16), ("stream 64x5ms", True, 5, 64)]
        rows = [(up, "chat", sc) for sc in scenarios for up in ups]
        rows += [(ups[0], api, sc) for api in CLIENT_APIS if api != "chat" for sc in scenarios]
        for up, api, (name, stream, delay, conc) in rows:
            best = await measure_row(up, api, stream, delay, conc, seconds, rounds)
            d, b, p = best["direct"], best["bare"], best["proxy"]
            line = f"{up.name:<17}{api:<11}{name:<15}{conc:>5}"
            line += f"{best['nginx'].cpu:>9.1f}" if floor else ""
            line += f"{b.cpu:>9.1f}{p.cpu:>10.1f}{p.cpu / b.cpu if b.cpu else float('nan'):>7.2f}"
            line += f"{p.cpu / best['nginx'].cpu:>8.2f}" if floor else ""
            line += (f"{b.rps / d.rps if d.rps else 0:>10.2f}{p.rps / d.rps if d.rps else 0:>11.2f}"
                     f"{p.p50 * 1000:>8.1f}{sum(t.errors for t in best.values()):>5}")
            if "ref" in best:
                r = best["ref"]
                line += f"{r.cpu:>9.1f}{r.cpu / b.cpu if b.cpu else 0:>10.2f}{p.cpu / r.cpu if r.cpu else 0:>10.2f}"
                low, median, high = paired_range(p, r)
                line += f"{median:>14.2f} ({low:.2f}-{high:.2f})"
            print(line, flush=True)
        print("\nresident memory after the rounds (warm), MiB, each relay's processes together:")
        for up in ups:
            rss = ", ".join(f"{name} {tree_rss_kib(pid) / 1024:.1f}" for name, pid in up.pids().items())
            print(f"  {up.name:<17}{rss}")
    finally:
        for up in ups:
            up.stop()


# ---------------------------------------------------------------------------------------------- scale scenarios

async def scale_streams(n: int, seconds: float) -> None:
    """`n` concurrent paced streams (5 ms per chunk) on one proxy process: throughput vs direct and CPU per chunk,
    next to the same at n/10 streams (flat per-chunk cost)."""
    up = Upstream("openai", "openai", False)
    up.start()
    try:
        await up.ready()
        print(f"concurrent streams of 64 chunks paced 5 ms (OpenAI mock; 320 ms per stream unloaded), {seconds:g} s "
              "each or three loaded streams' time if longer, direct, bare relay and proxy alternating, best of 2 "
              "rounds")
        header = (f"{'streams':>8}  {'target':<7}{'streams/s':>10}{'chunks/s':>10}{'p50 ms':>9}{'p99 ms':>9}"
                  f"{'cpu/chunk µs':>14}{'ratio':>7}{'err':>5}")
        print(header)
        print("-" * len(header))
        for conc in (max(n // 10, 1), n):
            best: dict[str, tuple[Result, float]] = {}
            for _ in range(2):
                for target in ("direct", "bare", "proxy"):
                    # Open the connections: one stream per slot, all at once; its time is a stream's time under
                    # this load (at 1,000 here, ~4.5 s: the mock on one core sends ~14k of the 200k chunks/s asked).
                    opened = await load(up.urls[target], True, 64, 5, conc, 1.0, conc, "chat")
                    # A run lasts three such streams at least: shorter, each slot makes one stream, and streams/s
                    # is the slowest stream of one burst, not a rate (a 3 s run at 1,000: 0.87x one run, 0.98x the
                    # next, for the same trees).
                    run = min(max(seconds, 3 * opened.elapsed), 60.0)
                    proc = {"proxy": up.proxy, "bare": up.bare}.get(target, up.mock)
                    pid = proc.pid if proc else 0
                    c0 = cpu_seconds(pid)
                    r = await load(up.urls[target], True, 64, 5, conc, run, 10**6, "chat")
                    cpu = cpu_seconds(pid) - c0
                    if target not in best or r.rps > best[target][0].rps:
                        best[target] = (r, cpu)
            for target, (r, cpu) in best.items():
                chunks = len(r.latencies) * 64
                ratio = f"{r.rps / best['direct'][0].rps:>7.2f}" if target != "direct" else f"{'':>7}"
                print(f"{conc:>8}  {target:<7}{r.rps:>10.1f}{chunks / r.elapsed:>10.0f}"
                      f"{pct(r.latencies, 50) * 1000:>9.1f}{pct(r.latencies, 99) * 1000:>9.1f}"
                      f"{cpu / max(chunks, 1) * 1e6:>14.1f}{ratio}{r.errors:>5}  {r.error_kinds or ''}", flush=True)
        print("cpu/chunk: the mock's for direct, the relay's own for bare and proxy; ratio: streams/s vs direct.")
    finally:
        up.stop()


async def scale_memory(n: int) -> None:
    """Memory per open stream: the proxy's RSS with `n` streams open, minus its RSS idle, divided by `n`."""
    up = Upstream("openai", "openai", False)
    up.start()
    try:
        await up.ready()
        pid = up.proxy.pid if up.proxy else 0
        print(f"memory per open stream: {n} streams held open through the proxy (1 chunk every 2 s)")
        for label in ("cold (first time)", "warm (pools grown)"):
            idle = rss_kib(pid)
            task = asyncio.ensure_future(load(up.urls["proxy"], True, 3, 2000, n, 0.5, n, "chat"))
            await asyncio.sleep(3.0)  # every stream open and between chunks
            peak = rss_kib(pid)
            r = await task
            if died(up.proxy) or died(up.mock):
                print(died(up.proxy) or died(up.mock))
                return
            print(f"  {label:<20} idle {idle / 1024:7.1f} MiB  with {n} open {peak / 1024:7.1f} MiB  "
                  f"-> {(peak - idle) / n:5.1f} KiB per open stream  (completed {len(r.latencies)}, "
                  f"errors {r.errors})")
    finally:
        up.stop()


async def scale_full_text(lengths: list[int], rounds: int) -> None:
    """MindIE full-text streams of growing length: CPU per chunk should stay flat (linear total cost)."""
    up = Upstream("mindie full-text", "mindie", True)
    up.start()
    try:
        await up.ready()
        print("MindIE full-text (cumulative) streams, 1 at a time, zero delay; CPU per chunk, best of "
              f"{rounds} alternating rounds.\nEvery cumulative chunk repeats the whole text so far, so the bytes on "
              "the wire grow quadratically for any relay;\nthe proxy's own work beyond the bare relay should not.")
        header = f"{'chunks':>8}{'bare µs/chunk':>15}{'proxy µs/chunk':>16}{'proxy-bare':>12}{'ratio':>7}"
        print(header)
        print("-" * len(header))
        for n in lengths:
            best = {"bare": float("inf"), "proxy": float("inf")}
            for _ in range(rounds):
                for target in ("bare", "proxy"):
                    proc = up.proxy if target == "proxy" else up.bare
                    pid = proc.pid if proc else 0
                    c0 = cpu_seconds(pid)
                    r = await load(up.urls[target], True, n, 0, 1, 120.0, 1, "chat", {"max_tokens": n})
                    if len(r.latencies) != 1 or r.chunks < n:
                        raise RuntimeError(f"{target}: {r.chunks} chunks of {n}, {r.errors} errors")
                    if r.latencies:
                        best[target] = min(best[target], (cpu_seconds(pid) - c0) / n * 1e6)
            b, p = best["bare"], best["proxy"]
            print(f"{n:>8}{b:>15.1f}{p:>16.1f}{p - b:>12.1f}{p / b:>7.2f}", flush=True)
    finally:
        up.stop()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="duration of each measured run (bounded)")
    ap.add_argument("--rounds", type=int, default=4,
                    help="alternating rounds (even: as many in each order); each target keeps its best")
    ap.add_argument("--quick", action="store_true", help="1 s runs, 2 rounds")
    ap.add_argument("--scale", choices=["streams", "memory", "fulltext", "workers", "all"],
                    help="a scale scenario instead of the ratio table")
    ap.add_argument("--streams", type=int, default=1000, help="concurrent streams for --scale streams/memory")
    ap.add_argument("--pin-load", action="store_true",
                    help="ratio table: pin the load generator to CPU 1 with the mocks (relays not saturated)")
    ap.add_argument("--ref", help="also measure the proxy of this commit (git archive), in the same rounds: the "
                                  "ratio table gets its CPU, its ratio to bare, and this tree's CPU / its CPU")
    ap.add_argument("--otel", action="store_true",
                    help="the proxy (and --ref's, if it has tracing) exports traces and metrics over OTLP to a "
                         "receiver on the mocks' CPU: tracing's cost")
    ap.add_argument("--compiled", action="store_true",
                    help="measure a compiled copy of this tree (setup.py, mypyc; needs a C compiler) as the proxy; "
                         "with --ref HEAD, proxy/ref is compiled / pure Python")
    ap.add_argument("--ref-compiled", action="store_true", help="the --ref commit is compiled too (mypyc)")
    args = ap.parse_args()
    global REF_TREE, PROXY_TREE
    if args.ref:
        REF_TREE = export_ref(args.ref)
        if args.ref_compiled:  # as tests/bench/instructions.py --ref-compiled
            sys.path.insert(0, os.path.dirname(HERE))
            import compiled_tree  # tests/compiled_tree.py

            source = export_ref(args.ref)
            compiled_tree.build(REF_TREE, src=source)
            shutil.rmtree(source, ignore_errors=True)
    if args.compiled:
        PROXY_TREE = compiled_copy()
    seconds, rounds = (1.0, 2) if args.quick else (args.seconds, args.rounds)
    raise_fd_limit()
    sink = await start_otlp_sink() if args.otel else None
    if args.pin_load or args.scale in ("streams", "memory", "fulltext", "all"):
        pin_self({1})  # with the mocks (see the docstring); `--scale workers` unpins
    print(f"dialect-proxy bench, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}\n")
    if sink is not None:
        endpoint = os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
        print(f"OpenTelemetry on: OTLP/HTTP export to {endpoint} (a receiver on CPU 1)\n")
    try:
        if args.scale is None:
            await ratio_table(seconds, rounds)
            return
        await scale(args, seconds, rounds)
    finally:
        if sink is not None:
            stop(sink)


async def scale(args: argparse.Namespace, seconds: float, rounds: int) -> None:
    if args.scale in ("streams", "all"):
        await scale_streams(args.streams, max(seconds, 3.0))
    if args.scale in ("memory", "all"):
        await scale_memory(args.streams)
    if args.scale in ("fulltext", "all"):
        await scale_full_text([1024, 2048, 4096, 8192], rounds)
    if args.scale in ("workers", "all"):
        import workers  # tests/bench/workers.py: wrk and nginx, so that the relays' workers get the cores

        await asyncio.to_thread(workers.scale_workers, max(round(seconds), 3), rounds, PROXY_TREE)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    finally:
        for tree in (REF_TREE, PROXY_TREE, *TEMP_DIRS):  # the temporary trees of --ref and --compiled, and the rest
            if tree is not None:
                shutil.rmtree(tree, ignore_errors=True)
