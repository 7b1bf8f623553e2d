"""The Model Server Protocol gauges: what an Inference Gateway's Endpoint Picker (EPP) reads from each pod's /metrics
to choose the pod for a request (docs/inference-gateway.md), under the names its `vllm` engine configuration reads.

    vllm:num_requests_waiting{model_name}  requests waiting: in this proxy's admission queue, plus those the engine
                                           holds unscheduled (its own waiting count, at most the proxy's in-flight)
    vllm:num_requests_running{model_name}  requests the engine is generating: this proxy's in-flight requests less
                                           the engine's waiting ones
    vllm:kv_cache_usage_perc{model_name}   the engine's KV cache in use, a fraction 0..1, as the engine last said

The proxy's own counts are read at the scrape (a burst shows at once); the engine's come from its metrics port, read
every POLL_INTERVAL seconds (MindIE refreshes them once a second). The proxy is the pod's only way in (the
InferencePool targets its port), so the engine's requests are the proxy's in-flight ones: the engine's reading only
splits them into waiting and running. When the engine's metrics cannot be read for STALE_AFTER seconds the three
gauges are left out (an EPP keeps no invented zero), `dialect_proxy_engine_metrics_up` is 0, and the reason is logged
and counted in `dialect_proxy_engine_metrics_failures_total{reason}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

import aiohttp
import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from proxy.dialects.engine_metrics import (
    HTTP_STATUS,
    REASONS,
    UNREACHABLE,
    EngineLoad,
    EngineMetricNames,
    EngineMetricsError,
    read_engine_load,
)
from proxy.settings import redact_url

if TYPE_CHECKING:
    from proxy.settings import UpstreamSettings

log: Final = logging.getLogger("dialect_proxy")

# Seconds between two reads of the engine's metrics: a quarter of MindIE's refresh, so a reading lags its engine by at
# most a second and a quarter.
POLL_INTERVAL: Final = 0.25
# Seconds a reading stands in for the engine after reads began to fail (two of MindIE's refreshes); then the gauges go.
STALE_AFTER: Final = 2.0
# Seconds one read may take (a metrics page is small and local).
READ_TIMEOUT: Final = 1.0
_BODY_LIMIT: Final = 4 * 1024 * 1024

WAITING: Final = "vllm:num_requests_waiting"
RUNNING: Final = "vllm:num_requests_running"
KV_CACHE: Final = "vllm:kv_cache_usage_perc"


class Queue(Protocol):
    """The proxy's admission for the engine (proxy/gateway/admission.py `Admission`): read, never changed."""

    @property
    def in_flight(self) -> int: ...

    @property
    def queued(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Failure:
    reason: str  # one of proxy/dialects/engine_metrics.py REASONS
    message: str


class EngineMetricsReader:
    """Reads the engine's metrics every POLL_INTERVAL seconds; keeps the last good reading, and why reads fail."""

    def __init__(self, upstream: UpstreamSettings, names: EngineMetricNames, tls: ssl.SSLContext | bool) -> None:
        assert upstream.metrics_url is not None
        self.upstream = upstream.name
        self.url = upstream.metrics_url
        self.shown = redact_url(upstream.metrics_url)  # in the log: without a password it may hold
        self.names = names
        self._tls = tls
        self.load: EngineLoad | None = None
        self.read_at = 0.0  # time.monotonic() of the last good reading
        self.failure: Failure | None = None  # the latest read's, None once one succeeds
        self.failures: dict[str, int] = dict.fromkeys(REASONS, 0)
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self._tls, limit=2),
                                              cookie_jar=aiohttp.DummyCookieJar())
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._session is not None:
            await self._session.close()

    async def _loop(self) -> None:
        while True:
            await self.read_once()
            await asyncio.sleep(POLL_INTERVAL)

    async def read_once(self) -> None:
        try:
            load = read_engine_load(await self._fetch(), self.names)
        except EngineMetricsError as e:
            self._failed(Failure(e.reason, str(e)))
            return
        if self.failure is not None:
            log.info(orjson.dumps({"event": "engine_metrics_readable", "upstream": self.upstream}).decode())
        self.load, self.read_at, self.failure = load, time.monotonic(), None

    async def _fetch(self) -> str:
        assert self._session is not None
        try:
            async with asyncio.timeout(READ_TIMEOUT), self._session.get(self.url) as resp:
                if resp.status != 200:
                    raise EngineMetricsError(HTTP_STATUS, f"GET {self.shown} answered HTTP {resp.status}")
                raw = await resp.content.read(_BODY_LIMIT)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise EngineMetricsError(UNREACHABLE, f"GET {self.shown} failed: {type(e).__name__} {e}".strip()) from None
        return raw.decode("utf-8", "replace")

    def _failed(self, failure: Failure) -> None:
        self.failures[failure.reason] += 1
        if self.failure is None or self.failure.reason != failure.reason:  # logged when it begins or changes
            log.warning(orjson.dumps({"event": "engine_metrics_unreadable", "upstream": self.upstream,
                                      "reason": failure.reason, "detail": failure.message,
                                      "gauges": f"left out after {STALE_AFTER:g} s without a reading"}).decode())
        self.failure = failure

    def current(self) -> EngineLoad | None:
        """The reading the gauges may use: the last good one, unless reads have failed for STALE_AFTER seconds."""
        if self.load is None or (self.failure is not None and time.monotonic() - self.read_at > STALE_AFTER):
            return None
        return self.load


class ModelServerGauges:
    """A Prometheus collector of the gauges above, for one engine and the proxy's queue in front of it."""

    def __init__(self, reader: EngineMetricsReader, queue: Queue, model: str) -> None:
        self.reader = reader
        self.queue = queue
        self.model = model  # the model_name label when the engine's metrics name none
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def collect(self) -> Iterator[Metric]:
        reader = self.reader
        load = reader.current()
        labels = ["upstream"]
        up = GaugeMetricFamily("dialect_proxy_engine_metrics_up", "1 while the engine's own metrics are read (the "
                               "Model Server Protocol gauges are shown), 0 when they are left out", labels=labels)
        up.add_metric([reader.upstream], 0.0 if load is None else 1.0)
        yield up
        failures = CounterMetricFamily("dialect_proxy_engine_metrics_failures", "reads of the engine's own metrics "
                                       "that failed, by reason", labels=[*labels, "reason"])
        for reason, count in reader.failures.items():
            failures.add_metric([reader.upstream, reason], float(count))
        yield failures
        if reader.read_at:
            age = GaugeMetricFamily("dialect_proxy_engine_metrics_age_seconds", "seconds since the engine's own "
                                    "metrics were last read", labels=labels)
            age.add_metric([reader.upstream], time.monotonic() - reader.read_at)
            yield age
        if load is None:
            return
        yield from self._protocol(load)

    def _protocol(self, load: EngineLoad) -> Iterator[Metric]:
        in_flight = self.queue.in_flight
        engine_waiting = min(int(load.waiting), in_flight)
        model = [load.model or self.model]
        for name, value, text in (
            (WAITING, self.queue.queued + engine_waiting,
             "requests waiting: in the proxy's admission queue, plus those its engine holds unscheduled"),
            (RUNNING, in_flight - engine_waiting, "requests the engine is generating"),
            (KV_CACHE, min(load.kv_cache, 1.0), "the engine's KV cache in use, a fraction 0..1"),
        ):
            family = GaugeMetricFamily(name, text, labels=["model_name"])
            family.add_metric(model, float(value))
            yield family

    def render(self) -> bytes:
        return generate_latest(self.registry)
