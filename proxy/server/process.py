"""The uvicorn server the CLI runs, with graceful drain on SIGTERM.

From the first SIGTERM on: the listening socket is closed (new connections are refused); idle kept-alive
connections are closed at once, without an answer (HTTP clients and the SDKs open a new connection, elsewhere);
connections with a request in flight finish it, with `connection: close`. A request that still reaches the app
while draining (it raced the close) gets 503 `shutting_down`, /readyz too. In-flight requests get `shutdown_grace`
seconds to finish; uvicorn then cancels what is left, and the handler ends each such request with an error the
client can see: an SSE error event (no [DONE]) for a stream already under way, a 503 envelope otherwise.
"""

from __future__ import annotations

from typing import Any

import uvicorn


class ProxyServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, proxy_state: Any) -> None:
        super().__init__(config)
        self.proxy_state = proxy_state

    async def shutdown(self, sockets: Any = None) -> None:
        self.proxy_state.shutting_down = True
        await super().shutdown(sockets)
