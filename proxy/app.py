"""create_app(settings) -> Starlette. The lifespan owns the aiohttp sessions (one per upstream)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from . import __version__
from .appstate import AppState
from .clients import ClientDialect
from .errors import ProxyError
from .handlers import InferenceEndpoint
from .redact import log_url
from .settings import Settings, UpstreamSettings
from .state import log_store, store_check
from .upstream import read_body

log = logging.getLogger("dialect_proxy")


def _error_response(err: ProxyError) -> Response:
    return Response(err.body(), err.status, headers=err.response_headers(), media_type="application/json")


def create_app(settings: Settings) -> ProxyApp:
    state = AppState(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # In the background: start-up is not held up by a slow upstream (each check is bounded by
        # readiness_timeout anyway).
        checks = asyncio.gather(log_upstream_checks(state), log_store(state.store, settings))
        try:
            yield
        finally:
            checks.cancel()
            state.shutting_down = True
            await state.close()

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "version": __version__})

    async def readyz(request: Request) -> Response:
        results, store = await asyncio.gather(asyncio.gather(*(_probe(state, u) for u in settings.upstreams)),
                                              store_check(state.store, settings.server.readiness_timeout))
        for u, result in zip(settings.upstreams, results, strict=True):
            state.metrics.upstream_up(u.name, result.ready)
        check = all if settings.server.ready_when == "all" else any
        ready = check(r.ready for r in results) and not state.shutting_down
        body: dict[str, Any] = {
            "status": "ready" if ready else "not ready",
            "upstreams": {u.name: r.summary() for u, r in zip(settings.upstreams, results, strict=True)},
            "checks": {u.name: r.as_json() for u, r in zip(settings.upstreams, results, strict=True)},
            # Reported, never a reason for 503: requests that need no state go on without it (README "State store").
            "state_store": store,
        }
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
        return Response(body, headers={"Content-Type": content_type})

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error_response(ProxyError(f"No route for {request.method} {request.url.path}.", 404, code="not_found"))

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        return _error_response(ProxyError(f"Method {request.method} is not allowed on {request.url.path}.", 405))

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path)
        return _error_response(
            ProxyError("Internal error in the proxy.", 500, type="server_error", code="internal_error")
        )

    inference = [Route(c.path, InferenceEndpoint(state, c), methods=["POST"]) for c in state.client_dialects.values()]
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
    # redirect); without the slash redirect such paths are served (inference, see ProxyApp) or 404.
    app.router.redirect_slashes = False
    app.state.proxy = state
    return ProxyApp(app, {route.path: route.endpoint for route in inference}, settings.server.api_keys,
                    list(state.client_dialects.values()))


class ProxyApp:
    """The ASGI app: the inference endpoints are called directly (they handle their own errors, disconnects
    and streaming), everything else goes through Starlette. This keeps Starlette's middleware, which wraps every
    `send` in two more coroutines, off the per-chunk path."""

    def __init__(
        self,
        app: Starlette,
        fast: dict[str, Any],
        api_keys: tuple[str, ...] = (),
        clients: list[ClientDialect] | None = None,
    ) -> None:
        self.app = app
        self.state = app.state
        self._fast = fast
        self._keys = tuple(f"Bearer {k}".encode() for k in api_keys)
        self._raw_keys = tuple(k.encode() for k in api_keys)  # `x-api-key: <key>` (Anthropic clients)
        self._clients = clients or []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            if self._keys and scope["path"].startswith("/v1/") and not self._authorized(scope):
                err = ProxyError(
                    "Incorrect or missing API key: send `Authorization: Bearer <key>` or `x-api-key: <key>`.", 401
                )
                status, headers, body = self._error(scope["path"], err)
                await send(
                    {
                        "type": "http.response.start",
                        "status": status,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"), *headers],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
            if scope["method"] == "POST":
                path = scope["path"]
                endpoint = self._fast.get(path[:-1] if path.endswith("/") and len(path) > 1 else path)
                if endpoint is not None:
                    await endpoint(scope, receive, send)
                    return
        await self.app(scope, receive, send)

    def _authorized(self, scope: Any) -> bool:
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        if any(hmac.compare_digest(given, key) for key in self._keys):
            return True
        api_key = next((v for k, v in scope["headers"] if k == b"x-api-key"), b"")
        return bool(api_key) and any(hmac.compare_digest(api_key, key) for key in self._raw_keys)

    def _error(self, path: str, err: ProxyError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """An error in the shape of the client dialect that owns `path` (OpenAI's elsewhere)."""
        for client in self._clients:
            if path == client.path or path.startswith(client.path + "/"):
                return client.error_response(err)
        return err.status, [(k.lower().encode(), v.encode()) for k, v in err.response_headers().items()], err.body()


def _model_obj(name: str, owner: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": owner}


async def _model_list(state: AppState) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for u in state.settings.upstreams:
        for client_name in u.aliases:
            seen.setdefault(client_name, _model_obj(client_name, u.name))
        for m in u.models:
            if m != "*":
                seen.setdefault(m, _model_obj(m, u.name))
    # Upstreams that take any name (default route, no configured names): list what the upstream itself serves.
    # One without a model listing (the engine API), or that does not answer: its name, which routes there through
    # "*", so that model pickers (Open WebUI, Dify) show something.
    for u in state.settings.upstreams:
        if "*" in u.models and not (set(u.models) - {"*"}) and not u.aliases:
            listed = await _upstream_models(state, u)
            for card in listed:
                seen.setdefault(card["id"], _model_obj(card["id"], u.name))
            if not listed:
                seen.setdefault(u.name, _model_obj(u.name, u.name))
    return list(seen.values())


async def _upstream_models(state: AppState, u: UpstreamSettings) -> list[dict[str, Any]]:
    dialect = state.dialects[u.name]
    path = dialect.path("models")
    if not path:
        return []
    headers = {}
    if u.api_key:
        headers["Authorization"] = f"Bearer {u.api_key}"
    try:
        resp = await state.clients[u.name].open(
            "GET", u.url + path, headers=headers, timeout=state.settings.server.readiness_timeout * 2
        )
        try:
            raw = await read_body(resp, state.settings.server.readiness_timeout * 2, limit=2**20)
        finally:
            resp.close()
        if resp.status != 200:
            return []
        return dialect.decode_models(orjson.loads(raw))
    except (ProxyError, orjson.JSONDecodeError):
        return []


@dataclass(frozen=True, slots=True)
class UpstreamCheck:
    """One readiness check of one upstream: what was asked, what came back, and why it is (not) ready. The open
    /readyz shows the path asked and the reason, never the upstream's address (that goes to the log)."""

    url: str
    ready: bool
    reachable: bool
    status: int | None
    reason: str

    def summary(self) -> str:
        return "up" if self.ready else "down: " + self.reason

    def as_json(self) -> dict[str, Any]:
        return {"path": urlsplit(self.url).path or "/", "ready": self.ready, "reachable": self.reachable,
                "status": self.status, "reason": self.reason}


async def _probe(state: AppState, u: UpstreamSettings) -> UpstreamCheck:
    """Ready when the upstream answers its health URL, or its dialect's model/health path, with 2xx within
    readiness_timeout. A 404 on the dialect's path means a wrong URL or dialect, not a live upstream; 401/403 a
    wrong key. An upstream whose dialect has no such path (the engine API) is ready when it answers at all."""
    path = state.dialects[u.name].path("health")
    url = u.health_url or u.url + (path or "/")
    shown = urlsplit(url).path or "/"
    headers = {"Authorization": f"Bearer {u.api_key}"} if u.api_key and u.health_url is None else {}
    timeout = state.settings.server.readiness_timeout
    try:
        resp = await state.clients[u.name].open("GET", url, headers=headers, timeout=timeout)
        resp.close()
    except ProxyError as err:
        return UpstreamCheck(url, False, False, None, state.redactor.for_client(err.message))
    status = resp.status
    if u.health_url is None and not path:
        if status < 500:
            return UpstreamCheck(url, True, True, status, f"answered HTTP {status} (the {u.dialect} dialect has no "
                                                         "health path: reachable is all that can be checked)")
        return UpstreamCheck(url, False, True, status, f"GET {shown} answered HTTP {status}")
    if 200 <= status < 300:
        return UpstreamCheck(url, True, True, status, f"GET {shown} answered HTTP {status}")
    if status == 404 and u.health_url is None:
        reason = (f"GET {shown} answered 404: the URL (host, port, path prefix) or the dialect ({u.dialect}) is "
                  f"wrong; `dialect-proxy probe URL` tells what the upstream speaks")
    elif status in (401, 403) and u.health_url is None:
        reason = (f"GET {shown} answered {status}: the upstream refused the API key "
                  + ("(check the variable named by api_key_env)" if u.api_key else "(set api_key_env)"))
    else:
        reason = f"GET {shown} answered HTTP {status} (expected 2xx)"
    return UpstreamCheck(url, False, True, status, reason)


async def log_upstream_checks(state: AppState) -> None:
    """At start-up: one log line per upstream saying whether it was reachable and ready."""
    checks = await asyncio.gather(*(_probe(state, u) for u in state.settings.upstreams))
    for u, check in zip(state.settings.upstreams, checks, strict=True):
        line = {"event": "upstream_check", "upstream": u.name, "dialect": u.dialect, "url": log_url(u.url),
                "reachable": check.reachable, "ready": check.ready, "status": check.status, "detail": check.reason}
        (log.info if check.ready else log.warning)(orjson.dumps(line).decode())
