"""The ASGI entry point: the inference endpoints are called directly, everything else goes through Starlette
(proxy/server/app.py builds both). A module of its own so that it can be compiled (setup.py) with the request path:
every resumption of a streaming request passes through its `__call__`."""

from __future__ import annotations

import datetime
from typing import Any, Final

from starlette.applications import Starlette

from proxy.clients import ClientDialect
from proxy.endpoint.inference import KEY_NAME_SCOPE
from proxy.errors import ProxyError
from proxy.gateway.keys import KeyRing

# The paths behind the inbound key check: the API under /v1/, and the rerank routes outside it (/rerank, /v2/rerank).
KEYED: Final = ("/v1/", "/v2/", "/rerank")

class ProxyApp:
    """The ASGI app: the inference endpoints are called directly (they handle their own errors, disconnects
    and streaming), everything else goes through Starlette. This keeps Starlette's middleware, which wraps every
    `send` in two more coroutines, off the per-chunk path."""

    def __init__(
        self,
        app: Starlette,
        fast: dict[str, Any],
        keys: KeyRing | None = None,
        clients: list[ClientDialect[Any]] | None = None,
        sockets: dict[str, Any] | None = None,
    ) -> None:
        self.app = app
        self.state = app.state
        self._fast = fast
        # The inbound keys (proxy/gateway/keys.py), read again when their file changes. The name of the key a request
        # used goes into its scope (KEY_NAME_SCOPE) for the access log, the `key` metrics label (docs/gateway.md
        # "Named keys") and its policy's limits (proxy/endpoint/exchange.py).
        self._keys = keys if keys is not None and keys.active else None
        self._clients = clients or []
        self._sockets = sockets or {}  # path -> ASGI `websocket` endpoint (proxy/server/responses_socket.py)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            if self._keys is not None and scope["path"].startswith(KEYED) and not await self._authorized(scope):
                err = ProxyError(
                    "Incorrect or missing API key: send `Authorization: Bearer <key>` or `x-api-key: <key>`.", 401
                )
                route, status, headers, body = self._error(scope["path"], err)
                self.state.proxy.metrics.refused(route, "invalid_api_key")
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
        elif scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _websocket(self, scope: Any, receive: Any, send: Any) -> None:
        """A WebSocket endpoint, behind the same API-key check; a refusal is an HTTP answer to the upgrade request
        with the envelope (ASGI's `websocket.http.response`)."""
        path = scope["path"]
        endpoint = self._sockets.get(path[:-1] if path.endswith("/") and len(path) > 1 else path)
        err: ProxyError | None = None
        if self._keys is not None and path.startswith("/v1/") and not await self._authorized(scope):
            err = ProxyError(
                "Incorrect or missing API key: send `Authorization: Bearer <key>` or `x-api-key: <key>`.", 401
            )
        elif endpoint is None:
            err = ProxyError(f"No WebSocket endpoint at {path}.", 404, code="not_found")
        if err is None and endpoint is not None:
            await endpoint(scope, receive, send)
            return
        assert err is not None
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        route, status, headers, body = self._error(path, err)
        if err.status == 401:
            self.state.proxy.metrics.refused(route, err.code)
        await send({"type": "websocket.http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), *headers]})
        await send({"type": "websocket.http.response.body", "body": body})

    async def _authorized(self, scope: Any) -> bool:
        """`Authorization: Bearer <key>` or `x-api-key: <key>` (Anthropic's) of a key held (the file's, or the Redis
        key store's) and not expired. Keys are looked up by their SHA-256, so the time taken does not tell how close
        a guess came."""
        assert self._keys is not None
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        policy = await self._keys.identify(given[7:]) if given[:7] == b"Bearer " else None
        if policy is None:
            policy = await self._keys.identify(next((v for k, v in scope["headers"] if k == b"x-api-key"), b""))
        if policy is None or policy.expired(datetime.datetime.now(datetime.UTC).date()):
            return False
        scope[KEY_NAME_SCOPE] = policy.name
        return True

    def _error(self, path: str, err: ProxyError) -> tuple[str, int, list[tuple[bytes, bytes]], bytes]:
        """The route (the client dialect's path, or "other") and an error in the shape of the client dialect that
        owns `path` (OpenAI's elsewhere)."""
        for client in self._clients:
            if path == client.path or path.startswith(client.path + "/"):
                return (client.path, *client.error_response(err))
        headers = [(k.lower().encode(), v.encode()) for k, v in err.response_headers().items()]
        return "other", err.status, headers, err.body()
