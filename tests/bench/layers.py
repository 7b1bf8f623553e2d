"""Where a relay's work goes, by layer of the request path (docs/speed.md, "How to measure").

    python tests/bench/instructions.py --compiled --keep DIR [--rows ...]   # callgrind dumps: DIR/<relay>-<row>.<pid>.1
    python tests/bench/layers.py callgrind DUMP --per 200 [--functions 20]   # instructions per request, by library
    python tests/bench/layers.py callgrind DUMP --per 200 --entries   # by entry point of the request path (ENTRIES)
    python tests/bench/layers.py profile [--stream] [--delay-ms 5] [--api chat] [--requests 200]   # pure build

`callgrind` reads one dump of tests/bench/instructions.py and splits its instructions (exclusive: each function's
own, so the rows add up to the total) by where they run: a compiled proxy module's functions (mypyc names them after
their module) in that module's layer (LAYERS), a C extension's in its library's (uvloop: the event loop; httptools:
the front end's HTTP parser; aiohttp's parsers, multidict, yarl, propcache, frozenlist: the upstream client; orjson),
and the interpreter with the C API (which compiled code calls for every dict, str and object it makes) in one row of
its own, as libc's (malloc, memcpy). In a compiled build the interpreter row is mostly aiohttp's and uvicorn's Python
code and the uncompiled proxy modules; in a pure build it is nearly everything, so:

`profile` starts the mock and a pure proxy under cProfile (switched on after a warm-up, by signal), drives it with
bench.py's load generator, and splits the profiled time by layer: each Python function's own time to its module's
layer (proxy modules as above; aiohttp, yarl, multidict: upstream client; prometheus_client: metrics; asyncio,
uvloop: event loop), each built-in's (orjson.dumps, a socket write, httptools' feed) to its callers' layers in
proportion to their calls. cProfile's own cost is per call, so layers of many small calls weigh more than their
share of the unprofiled time: read it with the callgrind totals beside it.

Not a test: it asserts nothing; every run bounded in count and time; loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import re
import signal
import sys
import tempfile
import time
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# proxy module (dotted, without `proxy.`) -> layer; the first matching prefix wins. Old and new module paths
# (issue 38's folder move) both listed.
LAYERS: list[tuple[str, str]] = [
    ("server.frontend", "front end"), ("frontend", "front end"), ("server.websocket", "front end"),
    ("websocket", "front end"),
    ("server.asgi", "ASGI entry"), ("asgi", "ASGI entry"), ("server.app", "ASGI entry"), ("app", "ASGI entry"),
    ("server", "server"),
    ("endpoint", "endpoint"), ("handlers", "endpoint"),
    ("clients", "client spoke"), ("validate", "client spoke"),
    ("dialects", "upstream spoke"), ("mapping", "upstream spoke"),
    ("hub", "hub"), ("stream", "hub"), ("events", "hub"), ("pipeline", "hub"), ("normalize", "hub"),
    ("canonical", "hub"), ("continuity", "hub"), ("params", "hub"), ("sse", "hub"),
    ("readings", "hub"),
    ("gateway", "upstream client"), ("upstream", "upstream client"), ("replicas", "upstream client"),
    ("admission", "upstream client"), ("routing", "upstream client"),
    ("metrics.tracing", "tracing"), ("tracing", "tracing"),
    ("metrics", "metrics"), ("local_metrics", "metrics"), ("prometheus", "metrics"), ("local", "metrics"),
    ("files", "metrics"), ("process", "server"), ("runtime", "server"),
    ("settings", "settings"), ("errors", "endpoint"),
]
# shared object (file name prefix) or site-packages package -> layer
LIBRARIES: list[tuple[str, str]] = [
    ("uvloop", "event loop (uvloop, asyncio)"), ("loop.cpython", "event loop (uvloop, asyncio)"),
    ("asyncio", "event loop (uvloop, asyncio)"),
    ("_asyncio", "event loop (uvloop, asyncio)"),
    ("httptools", "front end"), ("parser.cpython", "front end"), ("url_parser.cpython", "front end"),
    ("aiohttp", "upstream client"), ("_http_parser", "upstream client"), ("_http_writer", "upstream client"),
    ("_helpers", "upstream client"), ("multidict", "upstream client"), ("_multidict", "upstream client"),
    ("yarl", "upstream client"), ("_quoting", "upstream client"), ("propcache", "upstream client"),
    ("frozenlist", "upstream client"), ("_frozenlist", "upstream client"), ("aiohappyeyeballs", "upstream client"),
    ("prometheus_client", "metrics"),
    ("starlette", "ASGI entry"), ("uvicorn", "server"),
    ("orjson", "JSON (orjson)"),
    ("libpython", "interpreter and C API"), ("python3", "interpreter and C API"),
    ("libc.so", "libc (malloc, memcpy, ...)"), ("libm.so", "libc (malloc, memcpy, ...)"),
    ("ld-linux", "dynamic linker"),
]
MYPYC = re.compile(r"^(?:CPyDef|CPyPy|CPyL|CPyStatic|CPyInit)_(\w+)")


def proxy_layer(module: str) -> str:
    module = module.removeprefix("proxy.")
    for prefix, layer in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return "proxy (other)"


def library_layer(name: str) -> str | None:
    for prefix, layer in LIBRARIES:
        if name.startswith(prefix):
            return layer
    return None


# ------------------------------------------------------------------------------------------------ callgrind dumps


class Dump:
    """A callgrind dump's exclusive cost per function and each function's shared object."""

    def __init__(self, path: str) -> None:
        self.self_cost: dict[str, int] = defaultdict(int)
        self.calls: dict[tuple[str, str], int] = defaultdict(int)  # (caller, callee) -> the calls' inclusive cost
        self.obj: dict[str, str] = {}
        self.total = 0
        names: dict[str, dict[str, str]] = {"ob": {}, "fn": {}}
        ob = fn = cfn = ""
        in_call = False
        with open(path, errors="replace") as f:
            for line in f:
                c = line[:1]
                if c.isdigit() or c in ("+", "-", "*"):
                    if in_call:  # the line after `calls=` is the call's inclusive cost, not the caller's own
                        in_call = False
                        parts = line.split()
                        self.calls[fn, cfn] += int(parts[1]) if len(parts) > 1 else 0
                    else:
                        parts = line.split()
                        self.self_cost[fn] += int(parts[1]) if len(parts) > 1 else 0
                    continue
                if line.startswith("summary:"):
                    self.total = int(line.split()[1])
                    continue
                key, _, value = line.rstrip("\n").partition("=")
                if key == "ob":
                    ob = self._name(names["ob"], value)
                elif key == "cob":
                    self._name(names["ob"], value)
                elif key == "fn":
                    fn = self._name(names["fn"], value)
                    self.obj.setdefault(fn, ob)
                elif key == "cfn":
                    cfn = self._name(names["fn"], value)
                elif key == "calls":
                    in_call = True

    @staticmethod
    def _name(table: dict[str, str], value: str) -> str:
        value = value.strip()
        if value.startswith("("):
            ident, _, rest = value.partition(")")
            rest = rest.strip()
            if rest:
                table[ident] = rest
                return rest
            return table.get(ident, value)
        return value


def callgrind_layer(fn: str, obj: str) -> str:
    m = MYPYC.match(fn)
    base = obj.rsplit("/", 1)[-1]
    if m and "__mypyc" in base:
        return proxy_layer(m.group(1).replace("___", "."))
    if "__mypyc" in base:
        return "compiled proxy code (mypyc runtime)"
    return library_layer(base) or f"other ({base})"


def inclusive(d: Dump, pattern: str) -> float:
    """What the calls into functions matching `pattern` cost, all they called included: the sum of the calls' costs
    from callers outside the pattern (callgrind measures each call from entry to return: exact for functions that
    do not recurse)."""
    rx = re.compile(pattern)
    return sum(cost for (caller, callee), cost in d.calls.items() if rx.search(callee) and not rx.search(caller))


# The request path's entry points in a compiled build (mypyc's C names: module, class, function; both module
# layouts), each measured with all it calls (`inclusive`). Indented rows are parts of the row above.
ENTRIES: list[tuple[str, str]] = [
    ("front end: request head and body parsed (httptools), task started",
     r"^CPyDef_frontend___\w*Protocol___data_received$"),
    ("request task (ASGI entry and all below)", r"^CPyDef_frontend___run_asgi_\w*helper__$"),
    ("  endpoint, all it calls",
     r"^CPyDef_(handlers|endpoint|inference)_____call___\w*InferenceEndpoint_gen_\w*helper__$"),
    ("    client spoke: decode (validation, canonical request)", r"^CPyDef_\w+___decode_\w*_gen_\w*helper__$"),
    ("    JSON parse of the request", r"^CPyDef_((handlers|endpoint)____parse|request___parse_body)$"),
    ("    upstream spoke: the upstream request built", r"^CPyDef_\w*(Session|Dialect)___build_request$"),
    ("    upstream client: request sent, answer's head read (aiohttp)", r"^CPyDef_upstream___open_\w*helper__$"),
    ("    upstream client: body or stream reads (aiohttp)",
     r"^CPyDef_upstream___(read_body|read_StreamReads)\w*helper__$"),
    ("    upstream client: connection released", r"^CPyDef_upstream___release\w*helper__$"),
    ("    hub: upstream events decoded, normalised (pipeline)",
     r"^CPyDef_pipeline___Pipeline___(feed|feed_body|complete|finish)$"),
    ("    client spoke: encode", r"^CPyDef_\w+Encoder___(feed|finish|head|keepalive|error)$"),
    ("    metrics observer", r"^CPyDef_(metrics|local_metrics|prometheus|definitions|local|observer)___\w+$"),
    ("    front end: the answer written (ASGI send)", r"^CPyDef_frontend___send_\w*helper__$"),
]


def entries(d: Dump) -> list[tuple[str, float]]:
    rows = [(name, inclusive(d, pattern)) for name, pattern in ENTRIES]
    inside = rows[0][1] + rows[1][1]
    rows.append(("outside these (event loop, aiohttp's response protocol, timers, GC)", d.total - inside))
    return rows


def by_layer_callgrind(d: Dump) -> dict[str, float]:
    """Instructions by layer, scaled to the dump's summary (its cost lines also hold what functions still running
    at the zeroing had run before it)."""
    out: dict[str, float] = defaultdict(float)
    for fn, cost in d.self_cost.items():
        out[callgrind_layer(fn, d.obj.get(fn, ""))] += cost
    scale = d.total / (sum(out.values()) or 1)
    return {name: cost * scale for name, cost in out.items()}


# ----------------------------------------------------------------------------------------------- cProfile, pure build

# Run as `layers.py _profiled OUT serve ...`: the proxy's CLI under a profiler switched on by SIGUSR1 and written to
# OUT (pstats) on SIGUSR2, so that start-up and warm-up are left out.
def profiled(out: str, argv: list[str]) -> None:
    import cProfile
    import runpy

    prof = cProfile.Profile(time.thread_time)  # CPU time (a shared machine's waits for a core do not count)
    signal.signal(signal.SIGUSR1, lambda *_: prof.enable())

    def dump(*_: object) -> None:
        prof.disable()
        prof.dump_stats(out + ".tmp")
        os.replace(out + ".tmp", out)

    signal.signal(signal.SIGUSR2, dump)
    sys.argv = ["proxy", *argv]
    runpy.run_module("proxy", run_name="__main__", alter_sys=True)


def python_layer(filename: str, name: str) -> str | None:
    """A profiled function's layer by its file; None for a built-in (its callers' layers take its time)."""
    if filename == "~":
        return None
    path = filename.replace(os.sep, "/")
    if "/proxy/" in path and "site-packages" not in path:
        module = path.rsplit("/proxy/", 1)[1].removesuffix(".py").replace("/", ".")
        return proxy_layer(module.removesuffix(".__init__"))
    if "site-packages/" in path:
        return library_layer(path.split("site-packages/", 1)[1]) or "other libraries"
    if "/asyncio/" in path:
        return "event loop (uvloop, asyncio)"
    return "standard library"


def by_layer_profile(path: str) -> tuple[dict[str, float], float]:
    stats = pstats.Stats(path).stats  # type: ignore[attr-defined]
    layer = {func: python_layer(func[0], func[2]) for func in stats}
    out: dict[str, float] = defaultdict(float)
    for func, (_cc, _nc, tt, _ct, callers) in stats.items():
        own = layer[func]
        if own is not None:
            out[own] += tt
            continue
        calls = {caller: v[1] for caller, v in callers.items()}  # built-in: share its time by its callers' calls
        total = sum(calls.values())
        if not total:
            out["event loop (uvloop, asyncio)"] += tt  # called by C code only: the loop's callbacks
            continue
        for caller, n in calls.items():
            out[layer.get(caller) or "event loop (uvloop, asyncio)"] += tt * n / total
    return out, sum(out.values())


async def run_profile(args: argparse.Namespace) -> None:
    sys.path.insert(0, HERE)
    import bench  # tests/bench/bench.py: the load generator and process helpers

    out = os.path.join(tempfile.mkdtemp(prefix="bench-layers-"), "proxy.pstats")
    mock_port, port = bench.free_port(), bench.free_port()
    mock = bench.start(["mock", "--port", str(mock_port), "--dialect", args.dialect], None, cwd=ROOT)
    serve = ["serve", "--port", str(port), "--upstream-url", f"http://127.0.0.1:{mock_port}", "--upstream-dialect",
             args.dialect, "--log-level", "warning"]
    proxy = bench.start([__file__, "_profiled", out, *serve], None, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    chunks = 64 if args.stream else 16
    conc = 1 if args.delay_ms else 4
    try:
        await bench.wait_up(url.replace(str(port), str(mock_port)) + "/health")
        await bench.wait_up(url + "/healthz")
        await bench.load(url, args.stream, chunks, args.delay_ms, conc, 120.0, 60, args.api)
        os.kill(proxy.pid, signal.SIGUSR1)
        r = await bench.load(url, args.stream, chunks, args.delay_ms, conc, 600.0, args.requests, args.api)
        os.kill(proxy.pid, signal.SIGUSR2)
        deadline = time.monotonic() + 60
        while not await asyncio.to_thread(os.path.exists, out) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        if r.errors:
            raise SystemExit(f"errors: {r.error_kinds}")
    finally:
        bench.stop(proxy, mock)
    layers, total = by_layer_profile(out)
    units = len(r.latencies) * (chunks if args.stream else 1)
    show(layers, total, f"profiled (cProfile) µs per {'chunk' if args.stream else 'request'}", units, scale=1e6)
    if args.functions:
        stats = pstats.Stats(out).stats  # type: ignore[attr-defined]
        top = sorted(stats.items(), key=lambda kv: -kv[1][2])[: args.functions]
        for (filename, line, name), (_cc, nc, tt, _ct, _callers) in top:
            where = filename.split("site-packages/")[-1].split("/proxy/")[-1]
            print(f"  {tt * 1e6 / units:>8,.1f} µs  {nc / units:6.2f} calls  {name}  {where}:{line}")


def show(layers: dict[str, float], total: float, unit: str, per: float, scale: float = 1.0) -> None:
    print(f"{unit}: {total * scale / per:,.1f} in all")
    for name, cost in sorted(layers.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<40} {cost * scale / per:>12,.1f}  {cost / total:6.1%}")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "_profiled":
        profiled(sys.argv[2], sys.argv[3:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    cg = sub.add_parser("callgrind", help="split one callgrind dump of tests/bench/instructions.py --keep")
    cg.add_argument("dump")
    cg.add_argument("--per", type=float, default=1.0, help="requests (or chunks) the dump counted")
    cg.add_argument("--functions", type=int, default=0, help="also list the N costliest functions (own cost)")
    cg.add_argument("--entries", action="store_true", help="the request path's entry points (ENTRIES), each with"
                    " all it calls: a compiled build's layers")
    cg.add_argument("--inclusive", type=int, default=0, help="also list the N costliest compiled proxy functions,"
                    " what they call included")
    pr = sub.add_parser("profile", help="the pure build under cProfile")
    pr.add_argument("--dialect", default="openai")
    pr.add_argument("--api", default="chat", choices=["chat", "responses", "messages"])
    pr.add_argument("--stream", action="store_true")
    pr.add_argument("--delay-ms", type=int, default=0, help="between the mock's chunks (5: the paced row)")
    pr.add_argument("--requests", type=int, default=200)
    pr.add_argument("--functions", type=int, default=0, help="also list the N costliest functions (own time)")
    args = ap.parse_args()
    if args.mode == "profile":
        asyncio.run(run_profile(args))
        return
    d = Dump(args.dump)
    if args.entries:
        print(f"instructions per unit: {d.total / args.per:,.0f} in all; entry points, all they call included")
        for name, cost in entries(d):
            print(f"  {name:<72} {cost / args.per:>10,.0f}  {cost / d.total:6.1%}")
        return
    show(by_layer_callgrind(d), d.total, "instructions", args.per)
    for fn, cost in sorted(d.self_cost.items(), key=lambda kv: -kv[1])[: args.functions]:
        print(f"  {cost / args.per:>10,.0f}  {fn}  [{d.obj.get(fn, '').rsplit('/', 1)[-1]}]")
    if args.inclusive:
        into: dict[str, int] = defaultdict(int)
        for (caller, callee), cost in d.calls.items():
            if caller != callee and MYPYC.match(callee):
                into[callee] += cost
        for fn, cost in sorted(into.items(), key=lambda kv: -kv[1])[: args.inclusive]:
            print(f"  {cost / args.per:>10,.0f}  {fn}")


if __name__ == "__main__":
    main()
