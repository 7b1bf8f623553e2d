"""The uvicorn server the CLI runs, with graceful drain on SIGTERM.

From the first SIGTERM on: no new connections; /readyz answers 503 and requests arriving on kept-alive connections
get 503 (so load balancers move on); in-flight requests get `shutdown_grace` seconds to finish. uvicorn then
cancels what is left, and the handler ends each such request with an error the client can see: an SSE error event
(no [DONE]) for a stream already under way, a 503 envelope otherwise.
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
