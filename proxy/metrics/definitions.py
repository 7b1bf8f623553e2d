"""Prometheus metrics for dialect-proxy: every metric's definition, and the exposition.

One :class:`Metrics` object per app owns a private :class:`CollectorRegistry` (tests build several apps in one
process). Each request gets a RequestObserver (proxy/metrics/observer.py) from :meth:`Metrics.request`; it resolves
its label children once, so the per-chunk call does no label lookups.

Label values are bounded (docs/decisions.md "Metrics labels"): ``model`` is a configured name or ``other`` (without a
config, the first 50 distinct names seen are kept); ``status`` is ``2xx``/``4xx``/``5xx``; codes, reasons and
finish reasons are cleaned and capped. Never a request id, user text or key.

Multiprocess mode (``uvicorn --workers N``): prometheus_client picks its value store when it is *imported*, from
``PROMETHEUS_MULTIPROC_DIR``. So the CLI must call :func:`prepare_multiprocess_dir` (or set the variable to an empty,
writable directory) before anything imports ``prometheus_client`` in the worker processes. Each worker keeps its
values in the same lock-free objects as a single process and copies them into prometheus_client's files
(proxy/metrics/files.py); :meth:`Metrics.render` merges the files of every worker, so one scrape of any worker shows
the whole server.

Every metric is documented in deploy/METRICS.md.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from typing import Any, Final

from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client import Gauge as PromGauge
from prometheus_client import Histogram as PromHistogram
from prometheus_client import values as _prom_values
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from proxy import __version__
from proxy.build import BUILD
from proxy.metrics.files import FileMirror
from proxy.metrics.labels import (
    CONTINUITY_EVENTS,
    DIALECTS,
    ERROR_CODES,
    MAX_CACHED_SERIES,
    MAX_ERROR_CODES,
    MAX_LABEL_LENGTH,
    MAX_LABEL_VALUES,
    MAX_UNCONFIGURED_MODELS,
    NONE,
    OTHER,
)
from proxy.metrics.local import Family, LiveGaugeChild, LocalCounter, LocalGauge, LocalHistogram
from proxy.metrics.observer import RequestObserver, Series

__all__ = [
    "CONTENT_TYPE",
    "MULTIPROC_ENV",
    "Metrics",
    "RequestObserver",
    "prepare_multiprocess_dir",
]

PREFIX: Final = "dialect_proxy"
MULTIPROC_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
# The classic text format. prometheus-client >= 0.22 names it CONTENT_TYPE_PLAIN_0_0_4; older ones call it
# CONTENT_TYPE_LATEST, so spell it out.
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"


# No `<name>_created` series: a creation timestamp per counter and histogram child, which no dashboard or alert reads
# and which roughly doubles the series of a counter (prometheus_client's switch, read when it renders; multiprocess
# mode has none anyway).
disable_created_metrics()  # type: ignore[no-untyped-call]

# Buckets (seconds). LLM latencies span milliseconds (one decode step) to many minutes (a long reasoning answer).
REQUEST_DURATION_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0,
    1800.0,
)
TTFT_BUCKETS: Final = (
    0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0,
    300.0, 600.0,
)
TOKEN_LATENCY_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0, 300.0,
)
OVERHEAD_BUCKETS: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)
QUEUE_WAIT_BUCKETS: Final = (
    0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0,
)
BATCH_SIZE_BUCKETS: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

_CODE_CLEAN: Final = re.compile(r"[^a-z0-9_.\-]+")


def prepare_multiprocess_dir(path: str | None = None) -> str:
    """Make ``PROMETHEUS_MULTIPROC_DIR`` point at an empty directory and return it.

    Call it once, in the parent process, before any worker starts and before any :class:`Metrics` is created; the
    workers inherit the variable and must import prometheus_client only after it is set (a spawned uvicorn worker
    does). An existing directory named by ``path`` or by the variable is emptied of ``*.db`` files: a previous
    run's files would otherwise be added to this run's counters, and after a container restart the new workers
    may get the old workers' pids and so continue their in-flight gauges. Without either, a fresh temporary
    directory is created.
    """
    path = path or os.environ.get(MULTIPROC_ENV)
    if path:
        os.makedirs(path, exist_ok=True)
        for entry in os.scandir(path):
            if entry.is_file() and entry.name.endswith(".db"):
                os.remove(entry.path)
    else:
        path = tempfile.mkdtemp(prefix="dialect-proxy-metrics-")
    os.environ[MULTIPROC_ENV] = path
    return path


def multiprocess_enabled_by_env() -> bool:
    """True when prometheus_client was imported with PROMETHEUS_MULTIPROC_DIR set (its values live in files)."""
    return _prom_values.ValueClass is not _prom_values.MutexValue


def _clean(value: object) -> str:
    text = _CODE_CLEAN.sub("_", str(value).strip().lower())[:64].strip("_")
    return text or NONE


class _BoundedLabel:
    """Keeps label values to a fixed allow-list, or to the first ``limit`` distinct values seen."""

    def __init__(self, allowed: Iterable[str] | None, limit: int) -> None:
        self._fixed = allowed is not None
        self._seen: set[str] = set(allowed) if allowed is not None else set()
        self._limit = limit
        self._lock = threading.Lock()

    def __call__(self, value: object) -> str:
        if not isinstance(value, str) or not value or len(value) > MAX_LABEL_LENGTH:
            return OTHER
        if value in self._seen:
            return value
        if self._fixed:
            return OTHER
        with self._lock:
            if len(self._seen) < self._limit:
                self._seen.add(value)
                return value
        return OTHER


class Metrics:
    """All metric objects of one app, on a private registry."""

    def __init__(self, configured_models: Iterable[str] | None, multiprocess: bool = False,
                 key_names: Iterable[str] = (), local: bool | None = None) -> None:
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}
        self._series: dict[tuple[str, str, str, bool, str | None], Series] = {}
        self._up: dict[str, Any] = {}  # upstream name -> its upstream_up child
        self._reads: dict[tuple[Any, tuple[str, ...]], LiveGaugeChild] = {}  # live_gauge, local=False
        self.multiprocess = multiprocess
        # Lock-free in-process values (proxy/metrics/local.py), copied into prometheus_client's files in
        # multiprocess mode. `local=False` (one process only) uses prometheus_client's own classes: the reference
        # the tests compare the exposition with.
        self.local = local is not False or multiprocess
        self._mirror = FileMirror() if multiprocess else None
        if multiprocess:
            path = os.environ.get(MULTIPROC_ENV)
            if not path or not os.path.isdir(path):
                raise RuntimeError(f"multiprocess metrics need {MULTIPROC_ENV} set to an existing directory")
            if not multiprocess_enabled_by_env():
                raise RuntimeError(
                    f"prometheus_client was imported before {MULTIPROC_ENV} was set, so this process keeps its "
                    "metrics in memory and other workers cannot see them; call "
                    "proxy.metrics.definitions.prepare_multiprocess_dir() before importing the app"
                )
            self._multiproc_dir: str | None = path
        else:
            self._multiproc_dir = None

        models = None if configured_models is None else [m for m in configured_models if isinstance(m, str)]
        self._model = _BoundedLabel(models, MAX_UNCONFIGURED_MODELS)
        self._route = _BoundedLabel(None, MAX_LABEL_VALUES)
        self._upstream = _BoundedLabel(None, MAX_LABEL_VALUES)
        key_names = list(key_names)
        self._key = _BoundedLabel([*key_names, NONE], MAX_LABEL_VALUES)
        self.per_key = bool(key_names)  # the key_* families exist only with inbound keys (else they repeat the totals)
        self._error_pairs: set[tuple[str, str]] = set()
        self._error_lock = threading.Lock()

        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        p = PREFIX
        kinds: tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]] = (
            (_local(LocalCounter, self._mirror), _local(LocalGauge, self._mirror), _local(LocalHistogram, self._mirror))
            if self.local
            else (PromCounter, PromGauge, PromHistogram)
        )
        Counter, Gauge, Histogram = kinds  # noqa: N806 (prometheus_client's classes or their lock-free stand-ins)

        self.requests = Counter(
            f"{p}_requests", "Requests answered, by route, upstream, model, stream, status class and outcome.",
            ["route", "upstream", "model", "stream", "status", "outcome"], registry=r,
        )
        self.request_duration = Histogram(
            f"{p}_request_duration_seconds",
            "End-to-end request duration as the client sees it, from request start to the last byte sent.",
            ["route", "upstream", "model", "stream", "status"], buckets=REQUEST_DURATION_BUCKETS, registry=r,
        )
        self.ttft = Histogram(
            f"{p}_time_to_first_token_seconds",
            "Streams: time from request start to the first chunk carrying content, reasoning or a tool call.",
            ["route", "upstream", "model"], buckets=TTFT_BUCKETS, registry=r,
        )
        self.itl = Histogram(
            f"{p}_inter_token_latency_seconds",
            "Streams: time between consecutive token-carrying chunks sent to the client.",
            ["route", "upstream", "model"], buckets=TOKEN_LATENCY_BUCKETS, registry=r,
        )
        self.overhead = Histogram(
            f"{p}_overhead_seconds",
            "Time spent in the proxy per request: duration minus the time spent waiting for the upstream.",
            ["route", "upstream", "stream"], buckets=OVERHEAD_BUCKETS, registry=r,
        )
        self.tokens = Counter(
            f"{p}_tokens", "Tokens reported by the upstream's usage, by kind (prompt, completion, cached, reasoning).",
            ["upstream", "model", "kind"], registry=r,
        )
        self.prefill = Histogram(
            f"{p}_upstream_prefill_seconds", "Prefill time per response, as the upstream reports it.",
            ["upstream", "model"], buckets=TTFT_BUCKETS, registry=r,
        )
        self.decode = Histogram(
            f"{p}_upstream_decode_token_seconds", "Decode time per generated token, as the upstream reports it.",
            ["upstream", "model"], buckets=TOKEN_LATENCY_BUCKETS, registry=r,
        )
        self.queue_wait = Histogram(
            f"{p}_upstream_queue_wait_seconds", "Queue wait per generated token, as the upstream reports it.",
            ["upstream", "model"], buckets=QUEUE_WAIT_BUCKETS, registry=r,
        )
        self.batch_size = Histogram(
            f"{p}_upstream_batch_size", "Batch size per generated token, as the upstream reports it.",
            ["upstream", "model"], buckets=BATCH_SIZE_BUCKETS, registry=r,
        )
        self.in_flight_requests = Gauge(
            f"{p}_in_flight_requests", "Requests being handled now.",
            ["route", "upstream", "model"], multiprocess_mode="livesum", registry=r,
        )
        self.in_flight_streams = Gauge(
            f"{p}_in_flight_streams", "Streaming requests being handled now.",
            ["route", "upstream", "model"], multiprocess_mode="livesum", registry=r,
        )
        self.upstream_errors = Counter(
            f"{p}_upstream_errors", "Errors reported by or about an upstream, by dialect and dialect error code.",
            ["upstream", "dialect", "code"], registry=r,
        )
        self.truncated_streams = Counter(
            f"{p}_truncated_streams", "Streams that failed after the 200 was sent (closed without [DONE]).",
            ["upstream", "model", "reason"], registry=r,
        )
        self.client_disconnects = Counter(
            f"{p}_client_disconnects",
            "Requests whose client went away before the answer was complete, by stage "
            "(before_first_chunk or mid_stream).",
            ["route", "upstream", "model", "stage"], registry=r,
        )
        self.finish_reasons = Counter(
            f"{p}_finish_reasons", "Completed answers by finish_reason (as sent to the client).",
            ["upstream", "model", "reason"], registry=r,
        )
        self.continuity = Counter(
            f"{p}_reasoning_continuity",
            "Reasoning continuity (proxy/hub/continuity.py) by event: tool-call turns whose reasoning was restored "
            "from the store or got the fallback; answers whose reasoning was recorded, or whose recording failed.",
            ["upstream", "event"], registry=r,
        )
        self.structured = Counter(
            f"{p}_structured_output",
            "Structured output emulated for an upstream that cannot honour it (docs/structured-output.md), by event: "
            "requests emulated, answers asked again after failing the schema, requests that failed after the last "
            "attempt (the client got structured_output_failed).",
            ["upstream", "event"], registry=r,
        )
        self.upstream_up_gauge = Gauge(
            f"{p}_upstream_up", "1 if the last health probe or connection to the upstream succeeded, else 0.",
            ["upstream"], multiprocess_mode="mostrecent", registry=r,
        )
        self.errors = Counter(
            f"{p}_errors", "Requests answered with an error (an error body, or an error event after the 200), by the "
            "client-facing error code; inbound authentication refusals too (upstream=\"none\").",
            ["route", "upstream", "code"], registry=r,
        )
        # Per inbound key (api_keys / api_keys_file names): who used what. Only when inbound keys are configured.
        self.key_requests: Any = None
        self.key_tokens: Any = None
        if self.per_key:
            self.key_requests = Counter(
                f"{p}_key_requests", "Requests answered, by inbound API key name, upstream, model and status class.",
                ["key", "upstream", "model", "status"], registry=r,
            )
            self.key_tokens = Counter(
                f"{p}_key_tokens", "Tokens reported by the upstream's usage, by inbound API key name and kind.",
                ["key", "upstream", "model", "kind"], registry=r,
            )
        # Per-key limits (proxy/gateway/limits.py, docs/sharing.md): refusals by key and reason, quota left, and
        # the limiter counting alone because its Redis does not answer.
        self.limited_requests = Counter(
            f"{p}_limited", "Requests a key's limits refused, by key name and reason (requests, tokens, concurrent, "
            "too_large, day, month, model).", ["key", "reason"], registry=r,
        )
        self.quota_remaining_gauge = Gauge(
            f"{p}_quota_remaining_tokens", "Tokens left of a key's quota in the current UTC day or month, as "
            "last seen by an admission.", ["key", "period"], multiprocess_mode="mostrecent", registry=r,
        )
        self.quota_gauge = Gauge(
            f"{p}_quota_tokens", "A key's quota of tokens per UTC day or month (api_keys_file), as last seen by an "
            "admission.", ["key", "period"], multiprocess_mode="mostrecent", registry=r,
        )
        self.limits_fail_open_total = Counter(
            f"{p}_limits_fail_open", "Requests admitted against this process's share of the limits because the "
            "shared counters (Redis) did not answer in time (server.limits_fail: open), by key name.", ["key"],
            registry=r,
        )
        # Gateway: replicas, failover, admission (proxy/gateway/replicas.py, proxy/gateway/admission.py,
        # docs/gateway.md).
        self.upstream_attempts = Counter(
            f"{p}_upstream_attempts", "Requests sent to an upstream replica, by result (ok, unreachable, timeout, "
            "bad_gateway, unavailable).", ["upstream", "replica", "result"], registry=r,
        )
        self.retries = Counter(
            f"{p}_retries", "Requests sent again to another replica before any byte reached the client, by the "
            "failed attempt's result.", ["upstream", "reason"], registry=r,
        )
        self.retrieval_batches = Counter(
            f"{p}_retrieval_batches", "Upstream requests that embeddings and rerank calls were sent as: one per call, "
            "more where the upstream's batch limit split its inputs (docs/retrieval.md).", ["route", "upstream"],
            registry=r,
        )
        self.replica_in_flight = Gauge(
            f"{p}_replica_in_flight", "Requests admitted to a replica and not finished.",
            ["upstream", "replica"], multiprocess_mode="livesum", registry=r,
        )
        self.replica_queue_length = Gauge(
            f"{p}_replica_queue_length", "Requests waiting in a replica's admission queue.",
            ["upstream", "replica"], multiprocess_mode="livesum", registry=r,
        )
        self.replica_queue_wait = Histogram(
            f"{p}_replica_queue_wait_seconds", "Time requests waited in a replica's admission queue (admitted or "
            "not).", ["upstream", "replica"], buckets=TTFT_BUCKETS, registry=r,
        )
        self.admission_rejections = Counter(
            f"{p}_admission_rejections", "Requests answered 429 by admission control, by reason (queue_full, "
            "queue_timeout).", ["upstream", "reason"], registry=r,
        )
        self.replica_up = Gauge(
            f"{p}_replica_up", "1 if the replica takes requests (not ejected, last active health check passed).",
            ["upstream", "replica"], multiprocess_mode="mostrecent", registry=r,
        )
        self.replica_ejections = Counter(
            f"{p}_replica_ejections", "Times a replica was taken out after consecutive failures (outlier ejection).",
            ["upstream", "replica"], registry=r,
        )
        self.affinity = Counter(
            f"{p}_affinity_decisions", "prefix_affinity picks: `owner` (the conversation's replica on the hash "
            "ring) or `spill` (moved on by the load bound or health).", ["upstream", "result"], registry=r,
        )
        self.build_info = Gauge(
            f"{p}_build_info", "Always 1; labels carry the proxy and Python versions and the build (python or mypyc).",
            ["version", "python_version", "build"], multiprocess_mode="max", registry=r,
        )
        self.build_info.labels(__version__, "{}.{}.{}".format(*sys.version_info[:3]), BUILD).set(1)

    # -- labels -------------------------------------------------------------------------------------------------

    def child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, cached: label values are bounded, so is this cache, and a dict lookup is several
        times cheaper than prometheus_client's `labels()` (which validates and locks on every call)."""
        key = (metric, labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def live_gauge(self, metric: Any, labels: tuple[str, ...], read: Callable[[], float],
                   combine: Callable[[Iterable[float]], float] = sum) -> None:
        """The child of the gauge `metric` for `labels` reads its value from `read()` when a scrape (or, with
        `--workers N`, a write to the files) collects it (proxy/metrics/local.py LiveGaugeChild), so the state it
        shows is never written to a metric. A second reader of the same labels is combined with the first. On a
        prometheus_client gauge (`Metrics(local=False)`): its `set_function`, reading the same way."""
        if isinstance(metric, LocalGauge):
            self._children[(metric, labels)] = metric.live(labels, read, combine)
            return
        live = self._reads.get((metric, labels))
        if live is None:  # the same readers and combining as a local one, behind prometheus_client's function
            live = self._reads[(metric, labels)] = LiveGaugeChild(read, combine)
            metric.labels(*labels).set_function(lambda: live.value)
        else:
            live.reads.append(read)

    def model_label(self, name: object) -> str:
        """The ``model`` label for a name: configured names pass, anything else is ``other``."""
        return self._model(name)

    def route_label(self, route: str) -> str:
        return self._route(route)

    def upstream_label(self, upstream: str | None) -> str:
        return self._upstream(upstream) if upstream else NONE

    def key_label(self, name: str | None) -> str:
        return self._key(name) if name else NONE

    def _error_code_label(self, dialect: str, code: object) -> tuple[str, str]:
        d = _clean(dialect)
        d = d if d in DIALECTS else OTHER
        pair = (d, _clean(code))
        if pair in self._error_pairs:
            return pair
        with self._error_lock:
            if len(self._error_pairs) < MAX_ERROR_CODES:
                self._error_pairs.add(pair)
                return pair
        return d, OTHER

    # -- API ----------------------------------------------------------------------------------------------------

    def request(
        self, route: str, upstream: str, model: str, stream: bool, started_at: float | None = None,
        key: str | None = None,
    ) -> RequestObserver:
        """Start observing one request. ``upstream`` is the configured upstream name (``""`` if none was chosen),
        ``model`` the client's model name (bounded here). ``started_at`` is a ``time.perf_counter()`` value if the
        request started before the observer was made (for example before the body was parsed)."""
        return RequestObserver(self, route, upstream, model, stream, started_at, key)

    def _series_for(self, route: str, upstream: str, model: str, stream: bool, key: str | None) -> Series:
        raw = (route, upstream, model, stream, key)
        found = self._series.get(raw)
        if found is None:
            found = Series(self, self.route_label(route), self.upstream_label(upstream), self.model_label(model),
                            stream, self.key_label(key))
            if len(self._series) < MAX_CACHED_SERIES:  # raw names are the client's: cache only so many
                self._series[raw] = found
        return found

    def refused(self, route: str, code: str) -> None:
        """A request refused before it had an upstream (inbound authentication): counted by its error code."""
        self.child(self.errors, self.route_label(route), NONE, code if code in ERROR_CODES else OTHER).inc()

    def limited(self, key: str, reason: str) -> None:
        """A request refused by its key's limits (proxy/gateway/limits.py)."""
        self.child(self.limited_requests, self.key_label(key), reason).inc()

    def quota_remaining(self, key: str, period: str, quota: int, tokens: int) -> None:
        """A key's quota for `period` (day, month) and the tokens left of it."""
        label = self.key_label(key)
        self.child(self.quota_gauge, label, period).set(quota)
        self.child(self.quota_remaining_gauge, label, period).set(tokens)

    def limits_fail_open(self, key: str) -> None:
        self.child(self.limits_fail_open_total, self.key_label(key)).inc()

    def structured_output(self, upstream: str, event: str) -> None:
        """An emulated structured-output event (proxy/endpoint/structured.py): emulated, reasked or failed."""
        self.child(self.structured, self.upstream_label(upstream), event).inc()

    def reasoning_continuity(self, upstream: str, event: str, count: int = 1) -> None:
        label = event if event in CONTINUITY_EVENTS else OTHER
        self.child(self.continuity, self.upstream_label(upstream), label).inc(count)

    def upstream_up(self, upstream: str, up: bool) -> None:
        gauge = self._up.get(upstream)
        if gauge is None:
            gauge = self.child(self.upstream_up_gauge, self.upstream_label(upstream))
            if len(self._up) < MAX_LABEL_VALUES:
                self._up[upstream] = gauge
        gauge.set(1 if up else 0)

    def render(self) -> tuple[bytes, str]:
        """The /metrics body and its content type. In multiprocess mode, all workers' values merged."""
        if self._mirror is None or self._multiproc_dir is None:
            return generate_latest(self.registry), CONTENT_TYPE
        self._mirror.flush()
        self._forget_dead_workers()
        registry = CollectorRegistry(auto_describe=False)
        MultiProcessCollector(registry, path=self._multiproc_dir)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE

    def flush_files(self) -> None:
        """Multiprocess mode: write this worker's changed values to its files (proxy/metrics/files.py), for the
        other workers' scrapes; called every FLUSH_INTERVAL seconds and when the worker stops. No-op otherwise."""
        if self._mirror is not None:
            self._mirror.flush()

    def _forget_dead_workers(self) -> None:
        """Drop the live-gauge files of workers that exited (uvicorn restarts workers without telling us), so the
        in-flight gauges don't keep a dead worker's last value. Counters and histograms of dead workers stay."""
        assert self._multiproc_dir is not None
        pids: set[int] = set()
        for entry in os.scandir(self._multiproc_dir):
            name = entry.name
            if name.startswith("gauge_live") and name.endswith(".db"):
                digits = name[: -len(".db")].rsplit("_", 1)[-1]
                if digits.isdigit():
                    pids.add(int(digits))
        for pid in pids:
            if pid != os.getpid() and not _pid_alive(pid):
                try:
                    mark_process_dead(pid, self._multiproc_dir)  # type: ignore[no-untyped-call]
                except FileNotFoundError:  # another worker's scrape removed it first
                    pass


def _local(family: type[Family], mirror: FileMirror | None) -> Callable[..., Any]:
    """A constructor with prometheus_client's signature for a proxy/metrics/local.py family (registered on
    `registry`; with its twin in `mirror`'s files in multiprocess mode)."""

    def make(name: str, documentation: str, labelnames: Iterable[str], *, registry: CollectorRegistry,
             buckets: Iterable[float] | None = None, multiprocess_mode: str = "") -> Family:
        made = family(name, documentation, list(labelnames)) if buckets is None else \
            family(name, documentation, list(labelnames), list(buckets))  # type: ignore[call-arg]
        registry.register(made)
        if mirror is not None:
            mirror.add(made, buckets, multiprocess_mode)
        return made

    return make


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True

