"""AppState: everything a request needs, built once per process (the app and the endpoints share it)."""

from __future__ import annotations

import os

from .clients import CLIENT_DIALECTS, ClientDialect
from .dialects import Dialect, get_dialect
from .metrics import Metrics
from .redact import Redactor
from .routing import Router
from .settings import Settings
from .state import open_store
from .upstream import UpstreamClient


class AppState:
    """Everything a request needs, built once per process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.router = Router(settings.upstreams)
        self.dialects: dict[str, Dialect] = {u.name: get_dialect(u.dialect) for u in settings.upstreams}
        self.redactor = Redactor.from_settings(settings)  # upstream text -> clients, logs, metric labels
        self.clients: dict[str, UpstreamClient] = {
            u.name: UpstreamClient(u, settings.server, self.redactor) for u in settings.upstreams
        }
        configured = self.router.configured_models()
        multiprocess = settings.server.workers > 1 or bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.metrics = Metrics(configured or None, multiprocess=multiprocess)
        self.store = open_store(settings)
        self.client_dialects: dict[str, ClientDialect] = {
            name: cls(settings, self.store) for name, cls in CLIENT_DIALECTS.items()
        }
        self.shutting_down = False

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()
        await self.store.close()
