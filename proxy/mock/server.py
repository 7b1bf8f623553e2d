"""The mock upstream server: `create_app(dialect, ...)` builds it, `run(...)` serves it with uvicorn.

Every dialect also serves the introspection endpoints used by the tests:
    GET  /_mock/stats          {"requests", "completed", "disconnects", "in_flight"} (inference requests only)
    GET  /_mock/last_request   {"method", "path", "headers", "body"} of the last inference request
    POST /_mock/reset          zero the counters
    GET  /health               200, empty body
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.applications import Starlette
from starlette.routing import Route

from . import deepseek, engine, mindie, openai, siliconstorm
from .asgi import SEND_KEY, Receive, Scope, Send, Stats
from .common import MockConfig, common_routes, parse_directives

RouteFactory = Callable[[MockConfig, Stats], list[Route]]

DIALECT_ROUTES: dict[str, RouteFactory] = {
    "openai": openai.routes,
    "mindie": mindie.routes,
    "siliconstorm": siliconstorm.routes,
    "deepseek": deepseek.routes,
    "engine": engine.routes,
}
DIALECTS: tuple[str, ...] = tuple(DIALECT_ROUTES)
# Variants of a dialect's server beyond today's ("" everywhere): name -> what it serves.
FLAVOURS: dict[str, dict[str, str]] = {
    "deepseek": deepseek.FLAVOURS,
}


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
    if dialect not in DIALECT_ROUTES:
        raise ValueError(f"unknown mock dialect {dialect!r}; expected one of {', '.join(DIALECTS)}")
    flavours = FLAVOURS.get(dialect, {})
    if flavour and flavour not in flavours:
        raise ValueError(f"unknown flavour {flavour!r} of the {dialect} mock; expected one of "
                         f"{', '.join(flavours) or 'none'}")
    cfg = MockConfig(dialect=dialect, full_text=full_text, api_key=api_key, served_model=served_model,
                     flavour=flavour)
    stats = Stats()
    if directives:
        stats.directives = parse_directives(directives)
    app = MockApp(routes=[*DIALECT_ROUTES[dialect](cfg, stats), *common_routes(stats)])
    app.state.mock_stats = stats
    app.state.mock_config = cfg
    return app


def run(host: str, port: int, dialect: str, full_text: bool = False, api_key: str | None = None,
        served_model: str | None = None, flavour: str = "", directives: str | None = None) -> None:
    """Serve the mock until interrupted."""
    import uvicorn

    app = create_app(dialect, full_text=full_text, api_key=api_key, served_model=served_model, flavour=flavour,
                     directives=directives)
    uvicorn.run(app, host=host, port=port, loop="uvloop", http="httptools", access_log=False,
                log_level="warning")
