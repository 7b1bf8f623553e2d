"""Prometheus metrics for dialect-proxy.

One :class:`Metrics` object per app owns a private :class:`CollectorRegistry` (tests build several apps in one
process). Each request gets a :class:`RequestObserver` from :meth:`Metrics.request`; it resolves its label
children once, so the per-chunk call (:meth:`RequestObserver.chunk`) does no label lookups.

Label values are bounded (DECISIONS.md "Metrics labels"): ``model`` is a configured name or ``other`` (without a
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
import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Final, Self

from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client import Gauge as PromGauge
from prometheus_client import Histogram as PromHistogram
from prometheus_client import values as _prom_values
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from proxy import __version__
from proxy.build import BUILD
from proxy.dialects import DIALECTS as DIALECT_REGISTRY
from proxy.errors import ERROR_TYPES
from proxy.hub.events import Timings
from proxy.hub.readings import Readings
from proxy.hub.readings import values as read_values
from proxy.metrics.files import FileMirror
from proxy.metrics.local import Family, HistogramChild, LiveGaugeChild, LocalCounter, LocalGauge, LocalHistogram

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

OTHER: Final = "other"
NONE: Final = "none"
MAX_UNCONFIGURED_MODELS: Final = 50  # DECISIONS.md: without a config, the first 50 distinct names are kept
MAX_LABEL_VALUES: Final = 50  # cap for route / upstream (config-bounded anyway; this is a guard)
MAX_ERROR_CODES: Final = 100  # distinct (dialect, code) pairs; later ones become "other"
MAX_LABEL_LENGTH: Final = 128
MAX_CACHED_SERIES: Final = 4096  # (route, upstream, model, stream, key) combinations whose children are kept resolved

OUTCOMES: Final = ("ok", "error", "truncated", "client_disconnect")
TRUNCATION_REASONS: Final = frozenset({"upstream_closed", "upstream_error", "idle_timeout", "invalid_data", "shutdown",
                                       "full_text_mismatch"})
FINISH_REASONS: Final = frozenset(
    {"stop", "length", "tool_calls", "function_call", "content_filter", "insufficient_system_resource"}
)
TOKEN_KINDS: Final = ("prompt", "completion", "cached", "reasoning")
DIALECTS: Final = frozenset({*DIALECT_REGISTRY, "any"})  # the `dialect` label: the registry's names, or "any"
CONTINUITY_EVENTS: Final = frozenset({"restored", "fallback", "recorded", "record_failed"})  # proxy/hub/continuity.py
# The `code` label of dialect_proxy_errors_total: the client-facing codes (DECISIONS.md's error table, proxy/errors.py's
# defaults and the codes the proxy's own refusals carry; deploy/METRICS.md lists them). Any other code is "other".
ERROR_CODES: Final = frozenset({
    *(code for _, code in ERROR_TYPES.values()), "invalid_json", "invalid_request", "unsupported_parameter",
    "unsupported_endpoint", "context_length_exceeded", "previous_response_not_found", "item_not_found",
    "response_not_found", "not_found", "state_store_unavailable", "state_store_full", "shutting_down",
    "internal_error", "missing_required_parameter", "tool_call_not_found", "invalid_encrypted_content",
    "upstream_path_not_found", "full_text_mismatch",
})

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

_now = time.perf_counter  # the clock of every duration here; tests replace it

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


def status_class(status: int) -> str:
    """``2xx`` / ``4xx`` / ``5xx`` (``3xx`` too, though the proxy never sends one). Anything odd is ``5xx``."""
    family = status // 100
    return f"{family}xx" if 2 <= family <= 5 else "5xx"


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
        self._series: dict[tuple[str, str, str, bool, str | None], _Series] = {}
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
                    "proxy.metrics.prometheus.prepare_multiprocess_dir() before importing the app"
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

    def _series_for(self, route: str, upstream: str, model: str, stream: bool, key: str | None) -> _Series:
        raw = (route, upstream, model, stream, key)
        found = self._series.get(raw)
        if found is None:
            found = _Series(self, self.route_label(route), self.upstream_label(upstream), self.model_label(model),
                            stream, self.key_label(key))
            if len(self._series) < MAX_CACHED_SERIES:  # raw names are the client's: cache only so many
                self._series[raw] = found
        return found

    def refused(self, route: str, code: str) -> None:
        """A request refused before it had an upstream (inbound authentication): counted by its error code."""
        self.child(self.errors, self.route_label(route), NONE, code if code in ERROR_CODES else OTHER).inc()

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


def _observe_readings(child: Any, readings: Readings) -> None:
    """Observe each value of an upstream's list (proxy/hub/readings.py; thousands for a long answer): read in place by a
    local histogram child, one by one by a prometheus_client one (`Metrics(local=False)`)."""
    if isinstance(child, HistogramChild):
        child.observe_readings(readings)
    else:
        for value in read_values(readings):
            child.observe(value)


class _Series:
    """The metric children of one (route, upstream, model, stream, key) combination, resolved once and shared by
    every request with these labels, so a request does no label lookups. Children that depend on how a request
    ends (status and outcome, token kind, finish reason) are resolved on first use, so the exposition has the same
    series in the same order as looking each one up per request."""

    __slots__ = ("_ends", "_errors", "_finish_reasons", "_m", "_timings", "_tokens", "in_flight", "in_flight_stream",
                 "itl", "key", "model", "overhead", "route", "stream", "stream_label", "ttft", "upstream")

    def __init__(self, m: Metrics, route: str, upstream: str, model: str, stream: bool, key: str) -> None:
        self._m = m
        self.route, self.upstream, self.model, self.key = route, upstream, model, key
        self.stream = stream
        self.stream_label = "true" if stream else "false"
        self.ttft = m.child(m.ttft, route, upstream, model)
        self.itl = m.child(m.itl, route, upstream, model)
        self.in_flight = m.child(m.in_flight_requests, route, upstream, model)
        self.in_flight_stream = m.child(m.in_flight_streams, route, upstream, model) if stream else None
        self.overhead: Any = None
        self._ends: dict[tuple[str, str], tuple[Any, Any, Any]] = {}
        self._tokens: dict[str, tuple[Any, Any]] = {}
        self._finish_reasons: dict[str, Any] = {}
        self._errors: dict[str, Any] = {}
        self._timings: dict[Any, Any] = {}

    def ended(self, status: str, outcome: str) -> tuple[Any, Any, Any]:
        """requests, key_requests (None without inbound keys) and request_duration children for a request that
        ended so."""
        found = self._ends.get((status, outcome))
        if found is None:
            m = self._m
            found = self._ends[(status, outcome)] = (
                m.child(m.requests, self.route, self.upstream, self.model, self.stream_label, status, outcome),
                m.child(m.key_requests, self.key, self.upstream, self.model, status) if m.per_key else None,
                m.child(m.request_duration, self.route, self.upstream, self.model, self.stream_label, status),
            )
        return found

    def tokens(self, kind: str) -> tuple[Any, Any]:
        """tokens and key_tokens (None without inbound keys) children for a token kind."""
        found = self._tokens.get(kind)
        if found is None:
            m = self._m
            found = self._tokens[kind] = (
                m.child(m.tokens, self.upstream, self.model, kind),
                m.child(m.key_tokens, self.key, self.upstream, self.model, kind) if m.per_key else None)
        return found

    def error(self, code: str) -> Any:
        """The errors child for a client-facing error code (bounded: ERROR_CODES, else "other")."""
        found = self._errors.get(code)
        if found is None:
            m = self._m
            label = code if code in ERROR_CODES else OTHER
            found = self._errors[code] = m.child(m.errors, self.route, self.upstream, label)
        return found

    def finish_reason(self, reason: str) -> Any:
        found = self._finish_reasons.get(reason)
        if found is None:
            m = self._m
            found = self._finish_reasons[reason] = m.child(m.finish_reasons, self.upstream, self.model, reason)
        return found

    def timing(self, histogram: Any) -> Any:
        """The child of one of the upstream's own timing histograms (labels upstream and model)."""
        found = self._timings.get(histogram)
        if found is None:
            found = self._timings[histogram] = self._m.child(histogram, self.upstream, self.model)
        return found


class RequestObserver:
    """Observes one request. Create it with :meth:`Metrics.request`; call :meth:`finish` exactly once (extra calls
    are ignored), or use it as a context manager, which finishes an unfinished request as a 500 ``error``."""

    __slots__ = (
        "_chunks", "_finished", "_first_token_t", "_headers_t", "_itl", "_itl_other", "_key", "_last_token_t", "_m",
        "_model", "_route", "_s", "_stream", "_t0", "_timings_seen", "_truncated", "_upstream", "_upstream_t0",
        "_usage_seen", "_wait",
    )

    def __init__(
        self, metrics: Metrics, route: str, upstream: str, model: str, stream: bool, started_at: float | None,
        key: str | None = None,
    ) -> None:
        self._t0 = _now() if started_at is None else started_at
        self._m = metrics
        s = self._s = metrics._series_for(route, upstream, model, bool(stream), key)
        self._route, self._upstream, self._model, self._key = s.route, s.upstream, s.model, s.key
        self._stream = s.stream
        self._upstream_t0: float | None = None
        self._headers_t: float | None = None
        self._wait = 0.0
        self._first_token_t: float | None = None
        self._last_token_t: float | None = None
        self._chunks = 0
        self._truncated = False
        self._usage_seen = False
        self._timings_seen = False
        self._finished = False
        # Inter-token latencies: a local histogram child, or prometheus_client's (`Metrics(local=False)`).
        self._itl: HistogramChild | None = s.itl if self._stream and isinstance(s.itl, HistogramChild) else None
        self._itl_other: Any = s.itl if self._stream and self._itl is None else None
        s.in_flight.inc()
        if s.in_flight_stream is not None:
            s.in_flight_stream.inc()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._finished:
            self.finish(500, False, None)

    @property
    def model(self) -> str:
        """The bounded ``model`` label this request is counted under."""
        return self._model

    @property
    def ttft(self) -> float | None:
        """Seconds from the request's start to the first chunk that carried a token (None before that)."""
        return None if self._first_token_t is None else self._first_token_t - self._t0

    # -- upstream timing ----------------------------------------------------------------------------------------

    def upstream_started(self) -> None:
        """Just before the request is sent upstream: the upstream wait starts."""
        self._upstream_t0 = _now()

    def upstream_headers(self) -> None:
        """The upstream's response headers arrived: the time since :meth:`upstream_started` was upstream wait."""
        if self._upstream_t0 is not None and self._headers_t is None:
            self._headers_t = _now()
            self._wait += self._headers_t - self._upstream_t0

    def add_upstream_wait(self, seconds: float) -> None:
        """Wall time spent awaiting upstream body reads (after the headers). Counts as upstream wait."""
        if seconds > 0:
            self._wait += seconds

    # -- hot path -----------------------------------------------------------------------------------------------

    def chunk(self, has_token: bool) -> None:
        """A chunk was sent to the client. ``has_token``: it carries content, reasoning or a tool call.

        For streams, the first such chunk sets TTFT (from request start); each later one adds an inter-token
        latency sample. Non-stream requests record neither (their TTFT is their duration)."""
        self.chunks(1, 1 if has_token else 0)

    def chunks(self, n: int, tokens: int) -> None:
        """`n` chunks sent to the client at once (the events of one upstream read), `tokens` of them carrying a
        token: as `n` calls of :meth:`chunk` in the same instant (one clock read; the tokens after the read's first
        one are inter-token latency samples of 0)."""
        self._chunks += n
        if not tokens:
            return
        now = _now()
        last = self._last_token_t
        self._last_token_t = now
        zeros = tokens - 1
        if last is None:
            self._first_token_t = now
            if self._stream:
                self._s.ttft.observe(now - self._t0)
        elif self._itl is not None:
            self._itl.observe(now - last)
        elif self._itl_other is not None:
            self._itl_other.observe(now - last)
        if zeros:
            if self._itl is not None:
                self._itl.observe_many(0.0, zeros)
            elif self._itl_other is not None:
                for _ in range(zeros):
                    self._itl_other.observe(0.0)

    # -- once per response --------------------------------------------------------------------------------------

    def usage(self, usage: dict[str, Any] | None) -> None:
        """OpenAI-shaped usage from the upstream (recorded even when the client did not ask for usage). Only the
        first call counts. DeepSeek's ``prompt_cache_hit_tokens`` stands in for a missing ``cached_tokens``.
        Objects are tested as `dict` (JSON's), not `Mapping`: an ABC's isinstance runs Python code."""
        if self._usage_seen or not isinstance(usage, dict):
            return
        self._usage_seen = True
        prompt_details = usage.get("prompt_tokens_details")
        completion_details = usage.get("completion_tokens_details")
        cached = _count(prompt_details.get("cached_tokens")) if isinstance(prompt_details, dict) else None
        if cached is None:
            cached = _count(usage.get("prompt_cache_hit_tokens"))
        reasoning = (
            _count(completion_details.get("reasoning_tokens")) if isinstance(completion_details, dict) else None
        )
        counts = (
            ("prompt", _count(usage.get("prompt_tokens"))),
            ("completion", _count(usage.get("completion_tokens"))),
            ("cached", cached),
            ("reasoning", reasoning),
        )
        s = self._s
        for kind, n in counts:
            if n is not None:
                total, per_key = s.tokens(kind)
                total.inc(n)
                if per_key is not None:
                    per_key.inc(n)

    def upstream_timings(self, timings: Timings) -> None:
        """The upstream's own timings (proxy/hub/events.py, seconds; an upstream dialect reads them from its fields).
        Only the first call counts."""
        if self._timings_seen:
            return
        self._timings_seen = True
        m, s = self._m, self._s
        if timings.prefill is not None:
            s.timing(m.prefill).observe(timings.prefill)
        if timings.decode is not None:
            _observe_readings(s.timing(m.decode), timings.decode)
        if timings.queue_wait is not None:
            _observe_readings(s.timing(m.queue_wait), timings.queue_wait)
        if timings.batch_size is not None:
            _observe_readings(s.timing(m.batch_size), timings.batch_size)

    def upstream_error(self, dialect: str, code: str) -> None:
        """An error from (or about) the upstream: the dialect's name and its own error code (e.g. an HTTP status),
        or "any" and what went wrong before any dialect answered (e.g. "connect_refused")."""
        d, c = self._m._error_code_label(dialect, code)
        self._m.child(self._m.upstream_errors, self._upstream, d, c).inc()

    def truncated(self, reason: str) -> None:
        """The stream failed after its 200 was committed. Counted once; the request ends as 5xx/truncated."""
        if self._truncated:
            return
        self._truncated = True
        label = reason if reason in TRUNCATION_REASONS else OTHER
        self._m.child(self._m.truncated_streams, self._upstream, self._model, label).inc()

    def finish(self, status: int, disconnected: bool, finish_reason: str | None, error: str | None = None) -> None:
        """The request is over. Records duration, requests_total, overhead, disconnects, finish_reason and `error`,
        the client-facing error code the request was answered with (its error body or error event), if any."""
        if self._finished:
            return
        self._finished = True
        now = _now()
        m = self._m
        s = self._s
        s.in_flight.dec()
        if s.in_flight_stream is not None:
            s.in_flight_stream.dec()

        if disconnected:
            outcome = "client_disconnect"
            status_label = status_class(status)
            stage = "mid_stream" if self._chunks else "before_first_chunk"
            m.child(m.client_disconnects, self._route, self._upstream, self._model, stage).inc()
        elif self._truncated:
            outcome, status_label = "truncated", "5xx"
        else:
            status_label = status_class(status)
            outcome = "ok" if status < 400 else "error"

        total = max(now - self._t0, 0.0)
        requests, key_requests, duration = s.ended(status_label, outcome)
        requests.inc()
        if key_requests is not None:
            key_requests.inc()
        duration.observe(total)
        if error is not None and not disconnected:
            s.error(error).inc()

        wait = self._wait
        if self._upstream_t0 is not None and self._headers_t is None:
            wait += now - self._upstream_t0  # never got headers (refused, timed out, cancelled): all of it waited
        overhead = s.overhead
        if overhead is None:
            overhead = s.overhead = m.child(m.overhead, self._route, self._upstream, s.stream_label)
        overhead.observe(min(max(total - wait, 0.0), total))

        if finish_reason is not None and outcome == "ok":
            s.finish_reason(finish_reason if finish_reason in FINISH_REASONS else OTHER).inc()


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value
