"""The baseline for the benchmark: the barest correct relay (raw ASGI + aiohttp, bytes in -> bytes out, no parsing,
no translation, no metrics). What the proxy costs beyond this is the price of translation and observability.
Its garbage collector is set as the proxy's (proxy/server/runtime.py), so the ratio does not count that setting as the
proxy's gain.

    python tests/bench/bare_relay.py PORT UPSTREAM_URL [WORKERS]

WORKERS > 1 (tests/bench/bench.py `--scale workers`): that many uvicorn worker processes, as `serve --workers N`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import aiohttp
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from proxy.server.runtime import tune_gc  # noqa: E402

UPSTREAM = sys.argv[2] if len(sys.argv) > 2 else "http://127.0.0.1:1025"
_session: aiohttp.ClientSession | None = None


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    global _session
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                tune_gc()
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                if _session is not None:
                    await _session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["path"] != "/v1/chat/completions":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    if _session is None:
        _session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1000),
                                         timeout=aiohttp.ClientTimeout(total=None))
    async with _session.post(UPSTREAM + "/v1/chat/completions", data=body,
                             headers={"Content-Type": "application/json"}) as resp:
        await send({"type": "http.response.start", "status": resp.status,
                    "headers": [(b"content-type", resp.headers.get("Content-Type", "").encode())]})
        async for data in resp.content.iter_any():
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


if __name__ == "__main__":
    workers = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    # a worker process imports the app by name (it re-reads PORT and UPSTREAM_URL from the same argv)
    uvicorn.run("bare_relay:app" if workers > 1 else app, app_dir=str(Path(__file__).resolve().parent),
                workers=workers if workers > 1 else None, host="127.0.0.1", port=int(sys.argv[1]), loop="uvloop",
                http="httptools", access_log=False,
                server_header=False,  # as the proxy (proxy/server/frontend.py frontend_options)
                proxy_headers=False,  # as the proxy (proxy/__main__.py): no middleware coroutine around the app
                log_level="warning")
