"""`dialect-proxy probe URL`: what an upstream is, found out with a handful of tiny bounded requests (runner.py).

Each upstream spoke declares its own probe steps (proxy/dialects/probing.py `Probe`); the runner knows no dialect by
name. May import: the upstream-dialect registry and spokes, the gateway's connection hints, the hub's SSE decoder;
nothing of the request path beyond that, so that a probe works even where that path has a bug.
"""
