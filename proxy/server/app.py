"""create_app(settings) -> the ASGI app (proxy/server/asgi.py ProxyApp around Starlette). The lifespan owns the aiohttp
sessions (one per upstream)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match, Route

from proxy import __version__
from proxy.build import BUILD
from proxy.endpoint.inference import InferenceEndpoint
from proxy.endpoint.retrieval import routes as retrieval_routes
from proxy.errors import ProxyError
from proxy.gateway.health import READY_CACHE, UpstreamCheck
from proxy.server import runtime
from proxy.server.appstate import AppState
from proxy.server.asgi import ProxyApp
from proxy.server.responses_socket import ResponsesSocket
from proxy.settings import Settings, UpstreamSettings, redact_url
from proxy.state import log_store, store_check

log = logging.getLogger("dialect_proxy")


def _error_response(err: ProxyError) -> Response:
    return Response(err.body(), err.status, headers=err.response_headers(), media_type="application/json")


def create_app(settings: Settings, tune_gc: bool = False) -> ProxyApp:
    """`tune_gc`: this process serves the app alone (the CLI): set its garbage collector for it
    (proxy/server/runtime.py)."""
    state = AppState(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # In the background: start-up is not held up by a slow upstream (each check is bounded by
        # readiness_timeout anyway).
        checks = asyncio.gather(log_upstream_checks(state), log_store(state.store, settings))
        state.start()
        if tune_gc:
            runtime.tune_gc()
        try:
            yield
        finally:
            checks.cancel()
            state.shutting_down = True
            await state.close()

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "version": __version__, "build": BUILD})

    async def readyz(request: Request) -> Response:
        results, store = await asyncio.gather(asyncio.gather(*(_check_upstream(state, u) for u in settings.upstreams)),
                                              store_check(state.store, settings.server.readiness_timeout))
        for u, result in zip(settings.upstreams, results, strict=True):
            state.metrics.upstream_up(u.name, result[0].ready)
        check = all if settings.server.ready_when == "all" else any
        ready = check(r.ready for r, _ in results) and not state.shutting_down
        body: dict[str, Any] = {
            "status": "ready" if ready else "not ready",
            "upstreams": {u.name: _summary(r, c, state.dialects[u.name].finding)
                          for u, (r, c) in zip(settings.upstreams, results, strict=True)},
            "checks": {u.name: _check_json(r, c, state.dialects[u.name].finding)
                       for u, (r, c) in zip(settings.upstreams, results, strict=True)},
            # Reported, never a reason for 503: requests that need no state go on without it (README "State store").
            "state_store": store,
        }
        if state.keys.active:  # failing open is reported, never a reason for 503 (docs/sharing.md)
            body["limits"] = state.limiter.status()
        if state.shutting_down:
            body["reason"] = "shutting down"
        return JSONResponse(body, 200 if ready else 503)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": await _model_list(state)})

    async def model(request: Request) -> Response:
        name = request.path_params["model"]
        try:
            route = state.router.resolve(name)
        except ProxyError as err:
            return _error_response(err)
        return JSONResponse(_model_obj(name, route.upstream.name))

    async def metrics(request: Request) -> Response:
        body, content_type = state.metrics.render()
        if state.model_server is not None:  # the Endpoint Picker's gauges, after the proxy's own (unchanged) metrics
            body += state.model_server.render()
        return Response(body, headers={"Content-Type": content_type})

    async def not_found(request: Request, exc: Exception) -> Response:
        message = f"No route for {request.method} {request.url.path}." + _route_hint(request, routes)
        return _error_response(ProxyError(message, 404, code="not_found"))

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        return _error_response(ProxyError(f"Method {request.method} is not allowed on {request.url.path}.", 405))

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path)
        return _error_response(
            ProxyError("Internal error in the proxy.", 500, type="server_error", code="internal_error")
        )

    inference = [Route(c.path, InferenceEndpoint(state, c), methods=["POST"]) for c in state.client_dialects.values()]
    inference += [Route(path, endpoint, methods=["POST"]) for path, endpoint in retrieval_routes(state)]
    routes = [
        *inference,
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        *(route for c in state.client_dialects.values() for route in c.routes()),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={404: not_found, 405: method_not_allowed, 500: server_error, Exception: server_error},
    )
    # Starlette would answer `/v1/models/` with a redirect built from the client's Host header (an open
    # redirect); without the slash redirect such paths are served (inference, see proxy/server/asgi.py) or 404.
    app.router.redirect_slashes = False
    app.state.proxy = state
    # A WebSocket mode (the Responses API's), on the path of each client dialect that declares one.
    sockets = {c.path: ResponsesSocket(state, c) for c in state.client_dialects.values() if c.websocket}
    return ProxyApp(app, {route.path: route.endpoint for route in inference}, state.keys,
                    list(state.client_dialects.values()), sockets)


def _route_hint(request: Request, routes: Sequence[BaseRoute]) -> str:
    """For a path that has no route: the route it probably meant, when a client's base URL lacked `/v1` (`POST
    /chat/completions`) or had one too many (`/v1/v1/messages`: the Anthropic SDK's base URL ends before `/v1`)."""
    path = request.url.path
    meant = path[len("/v1"):] if path.startswith("/v1/v1/") else "/v1" + path
    scope = {**request.scope, "path": meant}
    if not any(route.matches(scope)[0] == Match.FULL for route in routes):
        return ""
    return (f" Did you mean {meant}? (An OpenAI client's base URL ends in `/v1`, e.g. http://HOST:PORT/v1; an "
            "Anthropic client's ends before it.)")


def _model_obj(name: str, owner: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": owner}


async def _model_list(state: AppState) -> list[dict[str, Any]]:
    """Every name that routes: each upstream's aliases and configured models, and for the default route (the first
    upstream whose `models` has "*") the names its upstream lists itself (proxy/gateway/catalog.py, cached), so that a
    client that checks its model against this list finds it. A default route whose upstream lists nothing (the engine
    API, or no answer) shows its own name, which routes there, so that model pickers (Open WebUI, Dify) show
    something."""
    seen: dict[str, dict[str, Any]] = {}
    for u in state.settings.upstreams:
        for client_name in u.aliases:
            seen.setdefault(client_name, _model_obj(client_name, u.name))
        for m in u.models:
            if m != "*":
                seen.setdefault(m, _model_obj(m, u.name))
    default = next((u for u in state.settings.upstreams if "*" in u.models), None)
    if default is not None:
        listed = await state.catalogs[default.name].names()
        names = state.dialects[default.name].routable_models(listed) if listed else []
        for name in names:
            seen.setdefault(name, _model_obj(name, default.name))
        if not names and not (set(default.models) - {"*"}) and not default.aliases:
            seen.setdefault(default.name, _model_obj(default.name, default.name))
    return list(seen.values())


async def _check_upstream(state: AppState, u: UpstreamSettings) -> tuple[UpstreamCheck, dict[str, UpstreamCheck]]:
    """Probe every replica of `u`: (the upstream's check — its first ready replica's, else the first replica's —,
    every replica's check by name). An upstream is ready while any of its replicas is."""
    results = await state.replicas[u.name].check(READY_CACHE)
    checks = {r.name: c for r, c in results}
    check = next((c for c in checks.values() if c.ready), results[0][1])
    return check, checks


# An upstream's `finding` (proxy/dialects/base.py: what its answers showed, e.g. a MindIE stream of the other form than
# `full_text` says) is reported next to its check, never as its reason, and does not make it not ready: the requests
# it does not concern still work (docs/decisions.md "/readyz after a stream-form mismatch").
def _summary(check: UpstreamCheck, replicas: dict[str, UpstreamCheck], finding: str | None) -> str:
    if len(replicas) > 1 and check.ready:
        up = sum(c.ready for c in replicas.values())
        summary = "up" if up == len(replicas) else f"up ({up} of {len(replicas)} replicas)"
    else:
        summary = check.summary()
    return summary if finding is None else f"{summary}; {finding}"


def _check_json(check: UpstreamCheck, replicas: dict[str, UpstreamCheck], finding: str | None) -> dict[str, Any]:
    out = check.as_json()
    if finding is not None:
        out["finding"] = finding
    if len(replicas) > 1:
        out["replicas"] = {name: c.as_json() for name, c in replicas.items()}
    return out


async def log_upstream_checks(state: AppState) -> None:
    """At start-up: one log line per upstream saying whether it was reachable and ready."""
    results = await asyncio.gather(*(state.replicas[u.name].check(READY_CACHE) for u in state.settings.upstreams))
    for u, checks in zip(state.settings.upstreams, results, strict=True):
        for replica, check in checks:
            line = {"event": "upstream_check", "upstream": u.name, "dialect": u.dialect, "url": redact_url(replica.url),
                    "reachable": check.reachable, "ready": check.ready, "status": check.status,
                    "detail": check.reason}
            if len(checks) > 1:
                line["replica"] = replica.name
            (log.info if check.ready else log.warning)(orjson.dumps(line).decode())
