"""This tree's proxy behind another HTTP front end, measured against itself behind its own (docs/decisions.md, "The
HTTP front end"): a measuring instrument, not a way to run the proxy.

    python tests/bench/frontends.py compare uvicorn|granian [--compiled] [--seconds 1] [--rounds 2]
    python tests/bench/frontends.py run uvicorn|granian serve ARGS...     (what `compare` starts, from the tree to run)

`compare` runs the ratio table's rows (tests/bench/bench.py: the same mocks, load generator and CPU accounting, each
relay pinned to CPU 0, the bare relay, the proxy and the other front end taking turns, each keeping its best round)
and prints the CPU per non-stream request or per upstream chunk of the proxy behind its own front end and behind the
other one. `--compiled`: both run a compiled copy of this tree (tests/compiled_tree.py).

uvicorn: uvicorn's own httptools protocol (`http="httptools"`) in the same server the proxy runs
(proxy/server/process.py); of the proxy's limits it has only a connection cap (`limit_concurrency`: 503 beyond it,
counting running requests too). It has no header size limit, no header or body timeout, no disconnect hook (the handler
then waits on `receive()` for `http.disconnect`).

granian (PyPI `granian`, not a dependency: `pip install granian`): its ASGI server, one worker, one runtime thread,
uvloop; the header timeout is its `header_read_timeout`, the header size its `max_buffer_size` (at least 8 KiB);
`backpressure` caps requests under way, not connections (they wait instead of getting 503); no body timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SELF = os.path.abspath(__file__)


async def compare(which: str, compiled: bool, seconds: float, rounds: int) -> None:
    sys.path.insert(0, HERE)
    import bench  # tests/bench/bench.py

    tree = bench.compiled_copy() if compiled else ROOT
    bench.PROXY_TREE = tree if compiled else None
    bench.raise_fd_limit()
    ups = [bench.Upstream("openai", "openai", False), bench.Upstream("mindie full-text", "mindie", True)]
    try:
        for up in ups:
            up.start()
            port = bench.free_port()
            ft = ["--full-text"] if up.full_text else []
            up.ref = bench.start([SELF, "run", which, "serve", "--port", str(port),
                                  "--upstream-url", up.urls["direct"], "--upstream-dialect", up.dialect,
                                  "--log-level", "warning", *ft], 0, cwd=tree)
            up.urls["ref"] = f"http://127.0.0.1:{port}"
        for up in ups:
            await up.ready()
            await bench.wait_up(up.urls["ref"] + "/healthz")
        print(f"{'compiled' if compiled else 'pure Python'}; load average {os.getloadavg()[0]:.1f}; {seconds:g} s "
              f"runs, best of {rounds} alternating rounds; µs of CPU per non-stream request or upstream chunk\n")
        header = f"{'upstream':<17}{'client':<11}{'scenario':<15}{'bare':>8}{'ours':>8}{which:>9}{'ours/' + which:>14}"
        print(header)
        print("-" * len(header))
        scenarios = [("non-stream", False, 0, 16), ("stream 64x0ms", True, 0, 16), ("stream 64x5ms", True, 5, 64)]
        rows = [(up, "chat", sc) for sc in scenarios for up in ups]
        rows += [(ups[0], api, sc) for api in bench.CLIENT_APIS if api != "chat" for sc in scenarios]
        for up, api, (name, stream, delay, conc) in rows:
            best = await bench.measure_row(up, api, stream, delay, conc, seconds, rounds)
            b, p, o = best["bare"].cpu, best["proxy"].cpu, best["ref"].cpu
            print(f"{up.name:<17}{api:<11}{name:<15}{b:>8.1f}{p:>8.1f}{o:>9.1f}{p / o:>14.2f}", flush=True)
        print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
    finally:
        for up in ups:
            if up.ref is not None:
                bench.stop(up.ref)
                up.ref = None
            up.stop()
        if compiled:
            shutil.rmtree(tree, ignore_errors=True)


def main() -> None:
    if sys.argv[1:2] == ["compare"]:
        ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        ap.add_argument("which", choices=["uvicorn", "granian"])
        ap.add_argument("--compiled", action="store_true")
        ap.add_argument("--seconds", type=float, default=1.0)
        ap.add_argument("--rounds", type=int, default=2)
        args = ap.parse_args(sys.argv[2:])
        asyncio.run(compare(args.which, args.compiled, args.seconds, args.rounds))
        return
    if sys.argv[1:2] != ["run"]:
        raise SystemExit(__doc__)
    which, argv = sys.argv[2], sys.argv[3:]
    tree = os.getcwd()
    sys.path.insert(0, tree)
    from proxy import __main__ as cli

    settings = cli.settings_from_args(cli.parser().parse_args(argv), os.environ)
    s = settings.server
    cli.configure_logging(s.log_level)
    if which == "uvicorn":
        from proxy.server.app import create_app
        from proxy.server.process import ProxyServer

        app = create_app(settings, tune_gc=True)
        config = cli._uvicorn_config(app, s.host, s.port, s.log_level, http="httptools", server_header=False,
                                     limit_concurrency=s.max_client_connections,
                                     timeout_graceful_shutdown=s.shutdown_grace)
        ProxyServer(config, app.state.proxy).run()
    elif which == "granian":
        from granian import Granian
        from granian.constants import HTTPModes, Interfaces, Loops
        from granian.http import HTTP1Settings

        os.environ[cli._ARGS_ENV] = json.dumps(argv)  # what proxy.__main__:worker_app builds its app from
        os.environ["PYTHONPATH"] = tree + os.pathsep + os.environ.get("PYTHONPATH", "")  # the worker's imports
        Granian("proxy.__main__:worker_app", factory=True, address=s.host, port=s.port, interface=Interfaces.ASGI,
                loop=Loops.uvloop, http=HTTPModes.http1, workers=1, runtime_threads=1,
                backpressure=s.max_client_connections,
                http1_settings=HTTP1Settings(header_read_timeout=int(min(s.header_timeout, 60.0) * 1000),
                                             max_buffer_size=max(s.max_header_bytes, 8192)),
                log_level=s.log_level,  # type: ignore[arg-type]
                workers_kill_timeout=int(s.shutdown_grace) or None).serve()
    else:
        raise SystemExit(f"front end {which!r}: uvicorn or granian")


if __name__ == "__main__":
    main()
