"""Benchmark: user-space instructions per request of the proxy and of the bare relay, counted by valgrind.

    python tests/bench/instructions.py [--requests 200] [--ref COMMIT] [--compiled] [--rows NAME,...]
                                                                            (`make bench-instructions`)
    python tests/bench/instructions.py --nginx [...]            adds nginx (the floor, bench.py's relay) and x nginx
    python tests/bench/instructions.py --frontend uvicorn [...]   ref: this tree's proxy behind uvicorn's own
                                                                  httptools protocol (tests/bench/frontends.py)

CPU time on a shared VM swings by +-15 % between runs, more than most single optimisations change, so before/after
figures from tests/bench/bench.py need many rounds. An instruction count does not swing: each relay runs under
valgrind's callgrind (Debian package `valgrind`), is driven by the same load generator as the ratio table
(tests/bench/bench.py `load`, 4 concurrent requests; the paced row one at a time, a quarter as many) for a
warm-up, then its counters are zeroed, `--requests` requests are made and its counters dumped; a figure is the
instructions (callgrind's Ir) of that window per request, or per upstream chunk for streams. Two runs of one tree
agree within about 0.3 %; `--ref COMMIT` measures that commit's proxy (git archive) in the same run, for a change's
before/after. `--compiled` counts a compiled copy of this tree (tests/compiled_tree.py, setup.py) as the proxy;
with `--ref HEAD`, proxy / ref is compiled / pure Python.

What it cannot show: time in the kernel (each read and write system call), cache misses and branch mispredictions;
and under valgrind's ~50x slowdown a zero-delay stream's events pile up into bigger reads than at full speed, where
the proxy gains more from its per-read work than the bare relay: its zero-delay ratios of instructions are higher
than the CPU table's. The paced row is the other way round: at full speed, 64 paced streams at once touch more
memory per chunk than one under valgrind, and the proxy touches more than the bare relay. Compare instructions with
instructions.

Bounded: every run is a fixed number of requests with a timeout; loopback only. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench  # noqa: E402  (tests/bench/bench.py: the load generator, process helpers, --ref export)

ROOT = os.path.dirname(os.path.dirname(HERE))
WARM_UP = 60  # requests before the counters are zeroed (imports, caches, connection pools)
STARTUP = 300.0  # seconds a relay may take to start under valgrind


@dataclass(frozen=True)
class Row:
    name: str
    dialect: str
    full_text: bool
    api: str
    stream: bool
    delay_ms: int = 0  # between the mock's chunks
    concurrency: int = 4
    share: int = 1  # the row makes requests // share (a paced row's requests take a second or more each)


ROWS = [
    Row("openai chat non-stream", "openai", False, "chat", False),
    Row("openai chat stream", "openai", False, "chat", True),
    Row("mindie-ft chat non-stream", "mindie", True, "chat", False),
    Row("mindie-ft chat stream", "mindie", True, "chat", True),
    Row("openai responses non-stream", "openai", False, "responses", False),
    Row("openai responses stream", "openai", False, "responses", True),
    Row("openai messages non-stream", "openai", False, "messages", False),
    Row("openai messages stream", "openai", False, "messages", True),
    # 5 ms apart, each chunk comes in a read of its own and wakes the relay: the per-read cost, which the CPU table's
    # paced rows pay on every chunk (at zero delay, events pile up into fewer, bigger reads). One stream at a time:
    # at 4, the relay under valgrind is busy enough for some reads to hold two events, and runs differ by +-5 %.
    Row("openai chat stream 5 ms", "openai", False, "chat", True, 5, 1, 4),
]
CHUNKS = 64  # per streamed answer, as in the ratio table
FRONTEND: str | None = None  # --frontend
NGINX: str | None = None  # --nginx: its binary


def callgrind(argv: list[str], cwd: str, out: str) -> subprocess.Popen[bytes]:
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p", *argv]
    return subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def wait_up(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + STARTUP
    while True:
        try:
            await bench.wait_up(url)
            return
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not come up under valgrind") from None
            await asyncio.sleep(1)


def control(pid: int, flag: str) -> None:
    subprocess.run(["callgrind_control", flag, str(pid)], check=True, timeout=120,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def instructions(out: str, pid: int) -> int:
    """The Ir of the first dump after the counters were zeroed (callgrind_control -d writes `<out>.<pid>.1`)."""
    (path,) = glob.glob(f"{out}.{pid}.1")
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


def nginx_argv(conf_dir: str, port: int, upstream: int) -> list[str]:
    """nginx as bench.py's floor relay, in one process (master_process off) for callgrind to follow."""
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        os.makedirs(os.path.join(conf_dir, sub), exist_ok=True)
    conf = os.path.join(conf_dir, "nginx.conf")
    with open(conf, "w") as f:
        f.write("master_process off;\n" + bench.NGINX_RELAY_CONF.format(dir=conf_dir, port=port, upstream=upstream))
    return [NGINX or "nginx", "-c", conf, "-p", conf_dir]


async def measure(row: Row, target: str, tree: str, requests: int, workdir: str) -> float:
    """Instructions per request (non-stream) or per upstream chunk (streams) of one relay."""
    mock_port, port = bench.free_port(), bench.free_port()
    ft = ["--full-text"] if row.full_text else []
    mock = bench.start(["mock", "--port", str(mock_port), "--dialect", row.dialect, *ft], None, cwd=ROOT)
    out = os.path.join(workdir, f"{target}-{row.name.replace(' ', '_')}")
    upstream = f"http://127.0.0.1:{mock_port}"
    if target == "bare":
        relay = callgrind([sys.executable, os.path.join(HERE, "bare_relay.py"), str(port), upstream], ROOT, out)
        health, api = "/", "chat"
    elif target == "nginx":
        relay = callgrind(nginx_argv(os.path.join(workdir, f"nginx-{port}"), port, mock_port), ROOT, out)
        health, api = "/health", "chat"
    else:
        serve = ["serve", "--port", str(port), "--upstream-url", upstream, "--upstream-dialect", row.dialect,
                 "--log-level", "warning", *ft]
        # --frontend: the same tree behind another front end (granian's worker is a child process, which callgrind
        # does not follow: only uvicorn here)
        other = target == "ref" and FRONTEND
        main = [os.path.join(HERE, "frontends.py"), "run", FRONTEND] if other else ["-m", "proxy"]
        relay = callgrind([sys.executable, *main, *serve], tree, out)
        health, api = "/healthz", row.api
    url = f"http://127.0.0.1:{port}"
    try:
        await bench.wait_up(upstream + "/health")
        await wait_up(url + health, relay)
        chunks = CHUNKS if row.stream else 16
        warm = await bench.load(url, row.stream, chunks, row.delay_ms, row.concurrency, 600.0, WARM_UP // row.share,
                                api)
        control(relay.pid, "-z")
        result = await bench.load(url, row.stream, chunks, row.delay_ms, row.concurrency, 600.0,
                                  max(requests // row.share, 1), api)
        control(relay.pid, "-d")
        if warm.errors or result.errors or not result.latencies:
            raise RuntimeError(f"{target} {row.name}: errors {result.error_kinds or warm.error_kinds}")
        per = len(result.latencies) * (CHUNKS if row.stream else 1)
    finally:
        bench.stop(relay, mock)
    return instructions(out, relay.pid) / per


async def main() -> None:
    global FRONTEND, NGINX
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200, help="measured requests per relay and row (bounded)")
    ap.add_argument("--ref", help="also count the proxy of this commit (git archive), for a before/after")
    ap.add_argument("--compiled", action="store_true", help="the proxy is a compiled copy of this tree (mypyc)")
    ap.add_argument("--ref-compiled", action="store_true", help="the --ref commit is compiled too (mypyc)")
    ap.add_argument("--nginx", action="store_true", help="also count nginx relaying the same rows (the floor)")
    ap.add_argument("--keep", metavar="DIR", help="keep callgrind's dumps in DIR (tests/bench/layers.py reads them)")
    ap.add_argument("--frontend", choices=["uvicorn"],
                    help="ref: this tree's proxy behind uvicorn's own httptools protocol; not with --ref")
    ap.add_argument("--rows", help="comma-separated row names (default: all): " + ", ".join(r.name for r in ROWS))
    args = ap.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind is needed (Debian package `valgrind`)")
    rows = ROWS if not args.rows else [r for r in ROWS if r.name in {n.strip() for n in args.rows.split(",")}]
    if not rows:
        sys.exit("no such row; rows: " + ", ".join(r.name for r in ROWS))
    ref_tree = bench.export_ref(args.ref) if args.ref else None
    if ref_tree and args.ref_compiled:
        sys.path.insert(0, os.path.dirname(HERE))
        import compiled_tree  # tests/compiled_tree.py

        source = bench.export_ref(args.ref)
        compiled_tree.build(ref_tree, src=source)
        shutil.rmtree(source, ignore_errors=True)
    proxy_tree = ROOT
    if args.compiled:
        proxy_tree = bench.compiled_copy()
    if args.frontend:
        if ref_tree:
            sys.exit("--ref and --frontend both use the ref column: give one")
        FRONTEND = args.frontend
    workdir = args.keep if args.keep else tempfile.mkdtemp(prefix="bench-instructions-")
    os.makedirs(workdir, exist_ok=True)
    unit = "instructions per request (non-stream) or per upstream chunk (streams)"
    build = " (proxy: compiled copy of this tree)" if args.compiled else ""
    build += " (ref: compiled)" if ref_tree and args.ref_compiled else ""
    print(f"{unit}, callgrind, {args.requests} requests after {WARM_UP} to warm up, 4 concurrent (the paced row:"
          f" a quarter of them, one at a time){build}\n")
    if args.nginx:
        NGINX = bench.nginx_binary()
        if NGINX is None:
            sys.exit("--nginx: nginx is not installed (Debian package nginx)")
    head = "| row |" + (" nginx | x nginx |" if NGINX else "") + " bare | proxy | ratio |" + (
        " ref | ref ratio | proxy / ref |" if ref_tree or FRONTEND else "")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    try:
        for row in rows:
            line = f"| {row.name} |"
            if NGINX:
                floor = await measure(row, "nginx", ROOT, args.requests, workdir)
            bare = await measure(row, "bare", ROOT, args.requests, workdir)
            proxy = await measure(row, "proxy", proxy_tree, args.requests, workdir)
            if NGINX:
                line += f" {floor:,.0f} | {proxy / floor:.1f} |"
            line += f" {bare:,.0f} | {proxy:,.0f} | {proxy / bare:.2f} |"
            if ref_tree or FRONTEND:
                ref = await measure(row, "ref", ref_tree or proxy_tree, args.requests, workdir)
                line += f" {ref:,.0f} | {ref / bare:.2f} | {proxy / ref:.3f} |"
            print(line, flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        for tree in (ref_tree, proxy_tree if args.compiled else None):
            if tree:
                shutil.rmtree(tree, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
