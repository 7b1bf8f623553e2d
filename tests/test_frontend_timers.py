"""The front end's limits on a connection (header time, body time, the keep-alive wait between requests) share one
loop timer, moved rather than re-made as the connection goes from phase to phase (proxy/server/frontend.py, "guards"):
a kept-alive connection's requests arm no timer each. The limits themselves are tested against a real server in
tests/hostile/test_hostile_clients.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from proxy.server.frontend import FrontendLimits, GuardedHttpToolsProtocol
from tests.hostile.test_hostile_clients import request_bytes
from tests.test_frontend_writes import Recorder


async def ok(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def test_requests_on_a_kept_alive_connection_arm_no_loop_timer_each() -> None:
    loop = asyncio.new_event_loop()
    armed: list[float] = []
    call_at, call_later = loop.call_at, loop.call_later

    def counted_at(when: float, callback: Any, *args: Any, **kw: Any) -> asyncio.TimerHandle:
        armed.append(when)
        return call_at(when, callback, *args, **kw)

    def counted_later(delay: float, callback: Any, *args: Any, **kw: Any) -> asyncio.TimerHandle:
        armed.append(loop.time() + delay)
        return call_later(delay, callback, *args, **kw)

    loop.call_at = counted_at  # type: ignore[method-assign]
    loop.call_later = counted_later  # type: ignore[method-assign]
    config = SimpleNamespace(loaded=True, loaded_app=ok, root_path="", asgi_version="3.0", timeout_keep_alive=5)
    state = SimpleNamespace(connections=set(), tasks=set(), default_headers=[], total_requests=0)
    conn = GuardedHttpToolsProtocol(config, state, {}, loop, limits=FrontendLimits())
    out = Recorder()
    conn.connection_made(out)

    async def serve(requests: int) -> None:
        for _ in range(requests):
            conn.data_received(request_bytes())
            for _ in range(1000):  # bounded: the answer completes within a few loop turns
                if conn.cycle is not None and conn.cycle.response_complete:
                    break
                await asyncio.sleep(0)

    loop.run_until_complete(serve(20))
    assert state.total_requests == 20 and not out.closed
    assert sum(1 for w in out.writes if w[:15] == b"HTTP/1.1 200 OK") == 20
    # The header limit armed at the connection's opening, then the keep-alive wait after the first answer (sooner
    # than that timer): two timers for twenty requests (uvicorn's protocol arms one per answer).
    assert len(armed) == 2
    conn.connection_lost(None)
    loop.close()
