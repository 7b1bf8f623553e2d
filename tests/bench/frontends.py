"""This tree's proxy behind another HTTP front end: a measuring instrument for `bench.py --frontend`, not a way to run
the proxy (docs/decisions.md, "The HTTP front end").

    python tests/bench/frontends.py uvicorn|granian serve ARGS...     (from the tree whose `proxy` to run)

uvicorn: uvicorn's own httptools protocol (`http="httptools"`) in the same server the proxy runs (proxy/server.py);
of the proxy's limits it has only a connection cap (`limit_concurrency`: 503 beyond it, counting running requests
too). It has no header size limit, no header or body timeout, no disconnect hook (the handler then waits on
`receive()` for `http.disconnect`).

granian (PyPI `granian`, not a dependency: `pip install granian`): its ASGI server, one worker, one runtime thread,
uvloop; the header timeout is its `header_read_timeout`, the header size its `max_buffer_size` (at least 8 KiB);
`backpressure` caps requests under way, not connections (they wait instead of getting 503); no body timeout.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    which, argv = sys.argv[1], sys.argv[2:]
    tree = os.getcwd()
    sys.path.insert(0, tree)
    from proxy import __main__ as cli

    settings = cli.settings_from_args(cli.parser().parse_args(argv), os.environ)
    s = settings.server
    cli.configure_logging(s.log_level)
    if which == "uvicorn":
        from proxy.app import create_app
        from proxy.server import ProxyServer

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
