"""The mock upstream server: `create_app(dialect, ...)` builds it, `run(...)` serves it with uvicorn.

Every dialect also serves the introspection endpoints used by the tests:
    GET  /_mock/stats          {"requests", "completed", "disconnects", "in_flight"} (inference requests only)
    GET  /_mock/last_request   {"method", "path", "headers", "body"} of the last inference request
    POST /_mock/reset          zero the counters
    GET  /health               200, empty body

A dialect's mock is the module proxy/mock/<dialect>.py that defines `routes(cfg, stats)`; it may declare `FLAVOURS`
(variants of its server: name -> what it serves) and `EXCEPTION_HANDLERS` (its own answers to what no route
serves). They are found here by that declaration: adding a dialect's mock is adding its module.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from types import ModuleType
from typing import Any

from starlette.applications import Starlette

from proxy.mock.asgi import SEND_KEY, Receive, Scope, Send, Stats
from proxy.mock.common import MockConfig, common_routes, parse_directives


def _dialect_mocks() -> dict[str, ModuleType]:
    found: dict[str, ModuleType] = {}
    for info in sorted(pkgutil.iter_modules([os.path.dirname(__file__)]), key=lambda i: i.name):
        module = importlib.import_module(f"{__package__}.{info.name}")
        if callable(getattr(module, "routes", None)):
            found[info.name] = module
    return found


MOCKS: dict[str, ModuleType] = _dialect_mocks()
DIALECTS: tuple[str, ...] = tuple(MOCKS)


def flavours(dialect: str) -> dict[str, str]:
    """Variants of a dialect's server beyond today's (""): name -> what it serves."""
    declared: dict[str, str] = getattr(MOCKS[dialect], "FLAVOURS", {})
    return declared


class MockApp(Starlette):
    """Starlette, plus: the server's own `send` is kept in the scope, so that a plan can reach the transport and
    close the connection abruptly (`drop`, `drop_before`)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[SEND_KEY] = send
        await super().__call__(scope, receive, send)


def create_app(dialect: str, full_text: bool = False, api_key: str | None = None,
               served_model: str | None = None, directives: str | None = None, flavour: str = "") -> Starlette:
    """A fake upstream speaking `dialect` (one of DIALECTS).

    full_text: MindIE/Siliconstorm `fullTextEnabled` mode (cumulative stream text, `full_text` on the last chunk).
    api_key: when set, inference requests need `Authorization: Bearer <api_key>`.
    served_model: when set, a request for another model gets the dialect's model-not-found error.
    directives: server-wide directives applied to every inference request (`error=503`, `hang`, `unhealthy`, ...);
    changed at run time with POST /_mock/directives.
    flavour: a variant of the dialect's server (FLAVOURS), e.g. deepseek `legacy`: the API of the seed document.
    """
    if dialect not in MOCKS:
        raise ValueError(f"unknown mock dialect {dialect!r}; expected one of {', '.join(DIALECTS)}")
    known = flavours(dialect)
    if flavour and flavour not in known:
        raise ValueError(f"unknown flavour {flavour!r} of the {dialect} mock; expected one of "
                         f"{', '.join(known) or 'none'}")
    cfg = MockConfig(dialect=dialect, full_text=full_text, api_key=api_key, served_model=served_model,
                     flavour=flavour)
    stats = Stats()
    if directives:
        stats.directives = parse_directives(directives)
    mock = MOCKS[dialect]
    # A mock's own answers to what no route serves (Starlette's plain-text 404 otherwise).
    handlers: dict[Any, Any] | None = getattr(mock, "EXCEPTION_HANDLERS", None)
    app = MockApp(routes=[*mock.routes(cfg, stats), *common_routes(stats)], exception_handlers=handlers)
    app.state.mock_stats = stats
    app.state.mock_config = cfg
    return app


def has_metrics_port(dialect: str) -> bool:
    """The dialect's server shows its engine's load on a port of its own (MindIE's metricsPort)."""
    return callable(getattr(MOCKS[dialect], "metrics_routes", None))


def create_metrics_app(app: Starlette) -> Starlette:
    """The metrics port of the mock `app` (made by create_app): its own server, showing the load of the same mock
    (its in-flight requests). Only for a dialect whose mock declares `metrics_routes(cfg, stats)`."""
    cfg: MockConfig = app.state.mock_config
    if not has_metrics_port(cfg.dialect):
        raise ValueError(f"the {cfg.dialect} mock has no metrics port")
    return Starlette(routes=MOCKS[cfg.dialect].metrics_routes(cfg, app.state.mock_stats))


def run(host: str, port: int, dialect: str, full_text: bool = False, api_key: str | None = None,
        served_model: str | None = None, flavour: str = "", directives: str | None = None,
        metrics_port: int | None = None) -> None:
    """Serve the mock until interrupted; with `metrics_port`, its metrics port too (MindIE's metricsPort)."""
    import asyncio

    import uvicorn

    app = create_app(dialect, full_text=full_text, api_key=api_key, served_model=served_model, flavour=flavour,
                     directives=directives)
    apps = [(app, port)] + ([(create_metrics_app(app), metrics_port)] if metrics_port is not None else [])
    servers = [uvicorn.Server(uvicorn.Config(a, host=host, port=p, loop="uvloop", http="httptools",
                                             access_log=False, log_level="warning")) for a, p in apps]

    async def serve() -> None:
        await asyncio.gather(*(server.serve() for server in servers))

    import uvloop

    uvloop.run(serve())
