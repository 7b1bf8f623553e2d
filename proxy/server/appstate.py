"""AppState: everything a request needs, built once per process (the app and the endpoints share it)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from typing import Any, Final

from proxy.clients import CLIENT_DIALECTS, ClientDialect
from proxy.dialects import Dialect, get_dialect
from proxy.dialects.readiness import readiness_model
from proxy.gateway.catalog import ModelCatalog
from proxy.gateway.keys import KeyRing, RemoteKeys
from proxy.gateway.limits import Limiter, LimitSettings
from proxy.gateway.redact import Redactor
from proxy.gateway.replicas import ReplicaSet
from proxy.gateway.routing import Router
from proxy.gateway.upstream import UpstreamClient, tls_context
from proxy.metrics.definitions import Metrics
from proxy.metrics.files import FLUSH_INTERVAL
from proxy.metrics.model_server import EngineMetricsReader, ModelServerGauges
from proxy.metrics.tracing import Telemetry
from proxy.metrics.tracing import create as create_telemetry
from proxy.settings import ConfigError, Settings
from proxy.state import open_store
from proxy.state.counters import Counters

log: Final = logging.getLogger("dialect_proxy")
KEY_FILE_POLL: Final = 0.5  # seconds between looks at the api_keys_file (a revoked key is refused within 1 s)


class AppState:
    """Everything a request needs, built once per process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.router = Router(settings.upstreams)
        self.dialects: dict[str, Dialect] = {u.name: get_dialect(u.dialect) for u in settings.upstreams}
        self.redactor = Redactor.from_settings(settings)  # upstream text -> clients, logs, metric labels
        configured = self.router.configured_models()
        multiprocess = settings.server.workers > 1 or bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.metrics = Metrics(configured or None, multiprocess=multiprocess,
                               key_names=settings.server.api_key_names)
        # Each upstream's replicas, each with its own connection pool (proxy/gateway/replicas.py).
        self.replicas: dict[str, ReplicaSet] = {
            u.name: ReplicaSet(u, settings.server, self.dialects[u.name], self.metrics, self.redactor)
            for u in settings.upstreams
        }
        # Each upstream's own model list, read when first needed and cached (proxy/gateway/catalog.py): `/v1/models`,
        # and the dialects whose translation depends on it.
        self.catalogs: dict[str, ModelCatalog] = {
            u.name: ModelCatalog(u, self.replicas[u.name], self.dialects[u.name], settings.server.readiness_timeout * 2)
            for u in settings.upstreams
        }
        for name, catalog in self.catalogs.items():
            self.dialects[name].catalog = catalog
        # The first replica's pool, for side requests that need no balancing.
        self.clients: dict[str, UpstreamClient] = {name: rs.replicas[0].client for name, rs in self.replicas.items()}
        self.store = open_store(settings)
        self.client_dialects: dict[str, ClientDialect[Any]] = {
            name: cls(settings, self.store) for name, cls in CLIENT_DIALECTS.items()
        }
        # OpenTelemetry traces and metrics (proxy/metrics/tracing.py): None unless an OTLP endpoint is configured.
        self.telemetry: Telemetry | None = create_telemetry(settings, self.metrics, self.redactor)
        # The Model Server Protocol gauges (server.model_server_metrics, implied by pool_member): None when off.
        self.model_server: ModelServerGauges | None = self._model_server_gauges()
        # The inbound keys and their policies (proxy/gateway/keys.py), read again when the file changes; their limits
        # counted in the state store's Redis when there is one (proxy/gateway/limits.py).
        s = settings.server
        env_keys = tuple(k for n, k in zip(s.api_key_names, s.api_keys, strict=True) if n.startswith("env-"))
        self.keys = KeyRing(s.api_keys_file, env_keys, _key_store(self.store) if s.api_keys_store else None)
        self.limiter = Limiter(_shared_counters(self.store, s.limits_timeout),
                               LimitSettings(s.limits_fail, s.limits_processes, s.limits_window,
                                             s.total_timeout + s.shutdown_grace + 60, s.limits_output_estimate),
                               self.metrics, self.store.describe())
        self._key_watch: asyncio.Task[None] | None = None
        self.shutting_down = False
        self._metrics_flusher: asyncio.Task[None] | None = None

    def _model_server_gauges(self) -> ModelServerGauges | None:
        server = self.settings.server
        if not (server.model_server_metrics or server.pool_member):
            return None
        u = self.settings.upstreams[0]  # the settings hold it to one upstream with an engine reading and a URL for it
        names = self.dialects[u.name].engine_metrics
        assert names is not None
        reader = EngineMetricsReader(u, names, tls_context(u))
        return ModelServerGauges(reader, self.replicas[u.name].replicas[0].admission, readiness_model(u))

    def start(self) -> None:
        """In the running event loop: background work (active health checks of replicas; in multiprocess mode,
        this worker's metric values written to the shared files every FLUSH_INTERVAL seconds)."""
        for rs in self.replicas.values():
            rs.start()
        if self.model_server is not None:
            self.model_server.reader.start()
        if self.metrics.multiprocess:
            self._metrics_flusher = asyncio.get_running_loop().create_task(self._flush_metrics())
        if self.keys.path is not None:
            self._key_watch = asyncio.get_running_loop().create_task(self._watch_keys())
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # the main thread's loop only
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.keys.reload)

    async def _watch_keys(self) -> None:
        """The api_keys_file read again within a second of a change (an edited file, a Kubernetes Secret's update)."""
        while True:
            await asyncio.sleep(KEY_FILE_POLL)
            try:
                self.keys.reload_if_changed()
            except Exception:  # a bug of ours must not end the watch for good
                log.exception("reading the api_keys_file again failed")

    async def _flush_metrics(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL)
            try:
                self.metrics.flush_files()
            except Exception:  # a bug of ours (or a prometheus_client that changed) must not end the writes for good
                log.exception("writing this worker's metrics to the multiprocess files failed")

    async def close(self) -> None:
        if self._key_watch is not None:
            self._key_watch.cancel()
        await self.limiter.close()
        for catalog in self.catalogs.values():
            await catalog.close()
        for rs in self.replicas.values():
            await rs.close()
        if self.model_server is not None:
            await self.model_server.reader.close()
        await self.store.close()
        if self._metrics_flusher is not None:
            self._metrics_flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._metrics_flusher
        self.metrics.flush_files()  # the last requests' values, for the scrapes of the workers that remain
        if self.telemetry is not None:  # what is left to export, bounded in time (a collector may be down)
            await asyncio.to_thread(self.telemetry.close)


def _shared_counters(store: object, timeout: float) -> Counters | None:
    """The limit counters in the state store's Redis (proxy/state/counters_redis.py); None for the memory store."""
    try:
        from proxy.state.redis import RedisStore
    except ImportError:
        return None
    if not isinstance(store, RedisStore):
        return None
    from proxy.state.counters_redis import RedisCounters

    return RedisCounters(store, timeout)


def _key_store(store: object) -> RemoteKeys:
    """The Redis key store (proxy/state/keystore.py) in the state store's Redis."""
    try:
        from proxy.state.redis import RedisStore
    except ImportError:
        RedisStore = None  # type: ignore[assignment,misc]  # noqa: N806
    if RedisStore is None or not isinstance(store, RedisStore):
        raise ConfigError("server.api_keys_store: the key store lives in Redis; set server.state_store to a "
                          "redis:// URL")
    from proxy.state.keystore import RedisKeyStore

    return RedisKeyStore(store)
