"""OpenTelemetry traces and metrics in the GenAI semantic conventions (docs/observability.md).

    Telemetry            one per app (so one per worker process: each worker builds its own providers after the
     │                   fork), from the standard OTEL_* environment variables (`OtelConfig`); None when off
     └── RequestTrace    one per request: the SERVER span of the client's call, a CLIENT span per upstream attempt
                         (retries and failover show as siblings), the GenAI metrics when the request ends

Off unless an OTLP endpoint is configured. Off, the request path pays one `is None` test per hook and the
OpenTelemetry packages are not even imported (they are the optional extra `otel`). On, nothing runs per chunk: time
to first chunk and token counts are read once, at the end, from what the metrics observer and the answer already
hold (proxy/metrics/observer.py RequestObserver, proxy/hub/events.py Answer). Message content is captured only when
the operator opts in (OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT), and then fed once per upstream read.

Export never holds up a request: spans go to a BatchSpanProcessor whose queue is bounded (OTEL_BSP_MAX_QUEUE_SIZE);
a span that finds it full is dropped and counted (`dialect_proxy_otel_spans_dropped_total`), as is a batch the
collector did not take. Metrics are aggregated in memory and exported every OTEL_METRIC_EXPORT_INTERVAL.
"""

from __future__ import annotations

import logging
import os
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import orjson

from proxy import __version__
from proxy.settings import ConfigError

if TYPE_CHECKING:
    from proxy.gateway.redact import Redactor
    from proxy.gateway.replicas import Replica
    from proxy.hub.canonical import RequestContext
    from proxy.hub.events import Answer, Delta
    from proxy.metrics.definitions import Metrics
    from proxy.metrics.observer import RequestObserver
    from proxy.settings import Settings

log: Final = logging.getLogger("dialect_proxy")

SCOPE: Final = "dialect_proxy"
OPERATIONS: Final = {"chat": "chat", "completions": "text_completion"}  # canonical kind -> gen_ai.operation.name
# Bucket boundaries the conventions give for each instrument (docs/gen-ai/gen-ai-metrics.md).
TOKEN_BUCKETS: Final = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
DURATION_BUCKETS: Final = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TTFT_BUCKETS: Final = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS: Final = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
SAMPLERS: Final = ("always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
                   "parentbased_traceidratio")
_TRUE: Final = ("true", "1", "yes", "on")
# OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT: the boolean of the first GenAI instrumentations, or the mode
# names of those that follow gen_ai_latest_experimental. Spans only: the proxy emits no log events.
_CAPTURE_ON: Final = (*_TRUE, "span_only", "span_and_event")
_CAPTURE_OFF: Final = ("", "false", "0", "no", "off", "no_content", "event_only")
# Request parameters recorded as gen_ai.request.* (hub form: Chat Completions names).
_PARAMS: Final = (("temperature", "gen_ai.request.temperature", float), ("top_p", "gen_ai.request.top_p", float),
                  ("top_k", "gen_ai.request.top_k", float),
                  ("frequency_penalty", "gen_ai.request.frequency_penalty", float),
                  ("presence_penalty", "gen_ai.request.presence_penalty", float),
                  ("seed", "gen_ai.request.seed", int))


@dataclass(frozen=True)
class Exporting:
    """Where one signal goes (OTLP)."""

    endpoint: str
    protocol: str  # "http/protobuf" or "grpc"
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # may carry a collector's key
    timeout: float = 10.0  # seconds
    compression: str | None = None
    certificate: str | None = None


@dataclass(frozen=True)
class OtelConfig:
    """The standard OTEL_* variables the proxy honours, checked at start-up (a mistake stops it with a message)."""

    traces: Exporting | None = None
    metrics: Exporting | None = None
    service_name: str = "dialect-proxy"
    resource: tuple[tuple[str, str], ...] = ()
    sampler: str = "parentbased_always_on"
    sampler_arg: float = 1.0
    capture_content: bool = False
    queue_size: int = 2048
    batch_size: int = 512
    schedule_delay: float = 5.0  # seconds
    metric_interval: float = 60.0  # seconds

    @property
    def enabled(self) -> bool:
        return self.traces is not None or self.metrics is not None

    @classmethod
    def parse(cls, env: Mapping[str, str]) -> OtelConfig:
        def get(name: str, default: str = "") -> str:
            return env.get(name, default).strip()

        if get("OTEL_SDK_DISABLED").lower() in _TRUE:
            return cls()
        signals: dict[str, Exporting | None] = {}
        for signal, path in (("TRACES", "v1/traces"), ("METRICS", "v1/metrics")):
            chosen = get(f"OTEL_{signal}_EXPORTER", "otlp").lower()
            if chosen == "none":
                signals[signal] = None
                continue
            if chosen != "otlp":
                raise ConfigError(f"OTEL_{signal}_EXPORTER: {chosen!r} is not supported (otlp or none)")
            protocol = get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL") or get("OTEL_EXPORTER_OTLP_PROTOCOL",
                                                                             "http/protobuf")
            if protocol not in ("http/protobuf", "grpc"):
                raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not supported "
                                  "(http/protobuf or grpc)")
            endpoint = get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
            if not endpoint:
                base = get("OTEL_EXPORTER_OTLP_ENDPOINT")
                # The signal's path goes after the generic endpoint for OTLP/HTTP (the specification's rule).
                endpoint = base if protocol == "grpc" or not base else base.rstrip("/") + "/" + path
            if not endpoint:
                signals[signal] = None  # no endpoint: this signal stays off
                continue
            if not endpoint.startswith(("http://", "https://")):
                raise ConfigError(f"OTEL_EXPORTER_OTLP_ENDPOINT: {endpoint!r} is not an http:// or https:// URL")
            timeout_ms = _number(get(f"OTEL_EXPORTER_OTLP_{signal}_TIMEOUT") or get("OTEL_EXPORTER_OTLP_TIMEOUT"),
                                 "OTEL_EXPORTER_OTLP_TIMEOUT", 10000.0)
            compression = get(f"OTEL_EXPORTER_OTLP_{signal}_COMPRESSION") or get("OTEL_EXPORTER_OTLP_COMPRESSION")
            if compression not in ("", "gzip", "none"):
                raise ConfigError(f"OTEL_EXPORTER_OTLP_COMPRESSION: {compression!r} is not gzip or none")
            signals[signal] = Exporting(
                endpoint=endpoint, protocol=protocol,
                headers=_pairs(get(f"OTEL_EXPORTER_OTLP_{signal}_HEADERS") or get("OTEL_EXPORTER_OTLP_HEADERS"),
                               "OTEL_EXPORTER_OTLP_HEADERS"),
                timeout=timeout_ms / 1000, compression=compression if compression == "gzip" else None,
                certificate=get(f"OTEL_EXPORTER_OTLP_{signal}_CERTIFICATE") or get("OTEL_EXPORTER_OTLP_CERTIFICATE")
                or None)
        sampler = get("OTEL_TRACES_SAMPLER", "parentbased_always_on").lower()
        if sampler not in SAMPLERS:
            raise ConfigError(f"OTEL_TRACES_SAMPLER: {sampler!r} is not one of {', '.join(SAMPLERS)}")
        ratio = _number(get("OTEL_TRACES_SAMPLER_ARG"), "OTEL_TRACES_SAMPLER_ARG", 1.0)
        if sampler.endswith("traceidratio") and not 0 <= ratio <= 1:
            raise ConfigError(f"OTEL_TRACES_SAMPLER_ARG: {ratio:g} is not a ratio between 0 and 1")
        capture = get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT").lower()
        if capture not in _CAPTURE_ON and capture not in _CAPTURE_OFF:
            raise ConfigError(f"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT: {capture!r} is not true/false "
                              "(or SPAN_ONLY, SPAN_AND_EVENT, NO_CONTENT)")
        return cls(
            traces=signals["TRACES"], metrics=signals["METRICS"],
            service_name=get("OTEL_SERVICE_NAME") or "dialect-proxy",
            resource=_pairs(get("OTEL_RESOURCE_ATTRIBUTES"), "OTEL_RESOURCE_ATTRIBUTES"),
            sampler=sampler, sampler_arg=ratio, capture_content=capture in _CAPTURE_ON,
            queue_size=int(_number(get("OTEL_BSP_MAX_QUEUE_SIZE"), "OTEL_BSP_MAX_QUEUE_SIZE", 2048, minimum=1)),
            batch_size=int(_number(get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE"), "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512,
                                   minimum=1)),
            schedule_delay=_number(get("OTEL_BSP_SCHEDULE_DELAY"), "OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000,
            metric_interval=_number(get("OTEL_METRIC_EXPORT_INTERVAL"), "OTEL_METRIC_EXPORT_INTERVAL", 60000,
                                    minimum=1) / 1000,
        )


def _number(text: str, name: str, default: float, minimum: float = 0) -> float:
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{name}: {text!r} is not a number") from None
    if value < minimum:
        raise ConfigError(f"{name}: {text!r} is below {minimum:g}")
    return value


def _pairs(text: str, name: str) -> tuple[tuple[str, str], ...]:
    """`k1=v1,k2=v2` with percent-encoded values (the W3C Baggage form the specification uses for both
    OTEL_EXPORTER_OTLP_HEADERS and OTEL_RESOURCE_ATTRIBUTES)."""
    out = []
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{name}: {key.strip()!r} is not key=value")  # never the value: it may be a key
        out.append((key.strip(), urllib.parse.unquote(value.strip())))
    return tuple(out)


def check(settings: Settings) -> OtelConfig:
    """The OTEL_* configuration of `settings`; with an endpoint set, the OpenTelemetry packages must be installed."""
    config = OtelConfig.parse(dict(settings.otel))
    if config.enabled:
        try:
            import opentelemetry.sdk.trace  # noqa: F401
        except ImportError:
            raise ConfigError("OTEL_EXPORTER_OTLP_ENDPOINT is set, but the OpenTelemetry SDK is not installed: "
                              "pip install 'dialect-proxy[otel]'") from None
        for exporting in (config.traces, config.metrics):
            if exporting is not None and exporting.protocol == "grpc":
                try:
                    import opentelemetry.exporter.otlp.proto.grpc  # noqa: F401
                except ImportError:
                    raise ConfigError("OTEL_EXPORTER_OTLP_PROTOCOL is grpc, but its exporter is not installed: "
                                      "pip install 'dialect-proxy[otel]'") from None
    return config


def create(settings: Settings, metrics: Metrics, redactor: Redactor) -> Telemetry | None:
    """The app's telemetry, or None when no OTLP endpoint is configured (or OTEL_SDK_DISABLED)."""
    config = check(settings)
    if not config.enabled:
        return None
    return Telemetry(config, metrics, redactor)


# ---------------------------------------------------------------------------------------------------------------


class Telemetry:
    """The OpenTelemetry providers of one process, and what every request needs from them."""

    def __init__(self, config: OtelConfig, metrics: Metrics, redactor: Redactor) -> None:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.config = config
        self.redactor = redactor
        self.capture = config.capture_content
        # process.pid tells the workers of one `--workers N` server apart (each builds its telemetry after the fork).
        self.resource = Resource.create({"service.name": config.service_name, "service.version": __version__,
                                         "process.pid": os.getpid(), **dict(config.resource)})
        self._trace = trace
        self.propagator = TraceContextTextMapPropagator()
        self.getter = _header_getter()
        self.SERVER = trace.SpanKind.SERVER
        self.CLIENT = trace.SpanKind.CLIENT
        self.dropped = _dropped_counter(metrics)
        self.processor: Any = None
        self.tracer: Any = None
        if config.traces is not None:
            self._start_traces(config, config.traces)
        self.meter_provider: Any = None
        self.instruments: _Instruments | None = None
        if config.metrics is not None:
            self._start_metrics(config, config.metrics)
        self._addresses: dict[str, tuple[str, int | None]] = {}

    def _start_traces(self, config: OtelConfig, exporting: Exporting) -> None:
        from opentelemetry.sdk.trace import TracerProvider, sampling

        sampler: Any = {
            "always_on": sampling.ALWAYS_ON,
            "always_off": sampling.ALWAYS_OFF,
            "traceidratio": sampling.TraceIdRatioBased(config.sampler_arg),
            "parentbased_always_on": sampling.ParentBased(sampling.ALWAYS_ON),
            "parentbased_always_off": sampling.ParentBased(sampling.ALWAYS_OFF),
            "parentbased_traceidratio": sampling.ParentBased(sampling.TraceIdRatioBased(config.sampler_arg)),
        }[config.sampler]
        provider = TracerProvider(resource=self.resource, sampler=sampler)
        self.processor = _bounded_processor(_span_exporter(exporting), config, self.dropped)
        provider.add_span_processor(self.processor)
        self.tracer_provider = provider
        self.tracer = provider.get_tracer(SCOPE, __version__)

    def _start_metrics(self, config: OtelConfig, exporting: Exporting) -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        reader = PeriodicExportingMetricReader(_metric_exporter(exporting),
                                               export_interval_millis=config.metric_interval * 1000,
                                               export_timeout_millis=exporting.timeout * 1000)
        self.meter_provider = MeterProvider(resource=self.resource, metric_readers=[reader])
        self.instruments = _Instruments(self.meter_provider.get_meter(SCOPE, __version__))

    def close(self, timeout: float = 5.0) -> None:
        """Export what is left, waiting at most about `timeout` seconds (a collector that is down must not hold up the
        shutdown); blocking: run it in a thread."""
        deadline = time.monotonic() + timeout
        if self.processor is not None:
            self.processor.force_flush(int(timeout * 1000))
            self.processor.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown(timeout_millis=max(deadline - time.monotonic(), 0.1) * 1000)

    def request(self, headers: Any, route: str, started: float, request_id: str) -> RequestTrace:
        """A request came in (`started`: its time.perf_counter(); `headers`: its ASGI headers): its SERVER span, in
        the client's trace when it sent a W3C traceparent. The trace's `trace_id` and `span_id` are for the access
        log line."""
        return RequestTrace(self, headers, route, started, request_id)

    def address(self, url: str) -> tuple[str, int | None]:
        """server.address and server.port of a replica's URL (parsed once per replica)."""
        found = self._addresses.get(url)
        if found is None:
            parts = urllib.parse.urlsplit(url)
            port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
            found = self._addresses[url] = (parts.hostname or "", port)
        return found


def _exporter_options(exporting: Exporting) -> dict[str, Any]:
    """The OTLP exporters' keyword arguments, the same for spans and metrics; gRPC and HTTP name TLS and compression
    differently."""
    options: dict[str, Any] = {"endpoint": exporting.endpoint, "headers": dict(exporting.headers),
                               "timeout": exporting.timeout}
    if exporting.protocol == "grpc":
        import grpc

        options.update(insecure=exporting.endpoint.startswith("http://"),
                       compression=grpc.Compression.Gzip if exporting.compression else None)
    else:
        from opentelemetry.exporter.otlp.proto.http import Compression

        options.update(certificate_file=exporting.certificate,
                       compression=Compression.Gzip if exporting.compression else Compression.NoCompression)
    return options


def _span_exporter(exporting: Exporting) -> Any:
    if exporting.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter

        return GrpcSpanExporter(**_exporter_options(exporting))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(**_exporter_options(exporting))


def _metric_exporter(exporting: Exporting) -> Any:
    if exporting.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter

        return GrpcMetricExporter(**_exporter_options(exporting))
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter(**_exporter_options(exporting))


def _dropped_counter(metrics: Metrics) -> Any:
    """dialect_proxy_otel_spans_dropped_total{reason}: prometheus_client's own counter (it takes a lock), as the
    export thread counts too; with --workers N it writes the multiprocess files itself."""
    from prometheus_client import Counter

    return Counter("dialect_proxy_otel_spans_dropped", "Spans not exported, by reason: queue_full (the export "
                   "queue, OTEL_BSP_MAX_QUEUE_SIZE, was full) or export_failed (the collector did not take a batch).",
                   ["reason"], registry=metrics.registry)


def _bounded_processor(exporter: Any, config: OtelConfig, dropped: Any) -> Any:
    """The SDK's BatchSpanProcessor, with each span it cannot take counted instead of logged (the SDK logs a
    warning per dropped span: under an outage, a log line per request)."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    queue_full = dropped.labels("queue_full")
    export_failed = dropped.labels("export_failed")

    class CountingExporter(SpanExporter):
        """Counts the spans of the batches the collector did not take (the SDK's exporter already retried)."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def export(self, spans: Any) -> Any:
            try:
                result = self.inner.export(spans)
            except Exception:
                export_failed.inc(len(spans))
                raise
            if result is not SpanExportResult.SUCCESS:
                export_failed.inc(len(spans))
            return result

        def shutdown(self) -> None:
            self.inner.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return bool(self.inner.force_flush(timeout_millis))

    class BoundedBatchSpanProcessor(BatchSpanProcessor):
        def __init__(self) -> None:
            super().__init__(CountingExporter(exporter), max_queue_size=config.queue_size,
                             schedule_delay_millis=config.schedule_delay * 1000,
                             max_export_batch_size=min(config.batch_size, config.queue_size))
            batch = getattr(self, "_batch_processor", None)
            self._queue = getattr(batch, "_queue", None)
            self._limit = config.queue_size

        def on_end(self, span: Any) -> None:
            queue = self._queue
            if queue is not None and len(queue) >= self._limit:
                queue_full.inc()
                return
            super().on_end(span)

    return BoundedBatchSpanProcessor()


class _Instruments:
    """The GenAI metric instruments (docs/gen-ai/gen-ai-metrics.md) and the server's request duration."""

    def __init__(self, meter: Any) -> None:
        self.token_usage = meter.create_histogram("gen_ai.client.token.usage", unit="{token}",
                                                  description="Number of input and output tokens used.",
                                                  explicit_bucket_boundaries_advisory=TOKEN_BUCKETS)
        self.operation_duration = meter.create_histogram("gen_ai.client.operation.duration", unit="s",
                                                         description="GenAI operation duration.",
                                                         explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self.request_duration = meter.create_histogram("gen_ai.server.request.duration", unit="s",
                                                       description="Generative AI server request duration such as "
                                                       "time-to-last byte or last output token.",
                                                       explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self.ttft = meter.create_histogram("gen_ai.server.time_to_first_token", unit="s",
                                           description="Time to generate first token for successful responses.",
                                           explicit_bucket_boundaries_advisory=TTFT_BUCKETS)
        self.tpot = meter.create_histogram("gen_ai.server.time_per_output_token", unit="s",
                                           description="Time per output token generated after the first token for "
                                           "successful responses.", explicit_bucket_boundaries_advisory=TPOT_BUCKETS)


def _header_getter() -> Any:
    """The W3C propagator's view of an ASGI scope's headers (lower-case bytes names)."""
    from opentelemetry.propagators.textmap import Getter

    class HeaderGetter(Getter[list[tuple[bytes, bytes]]]):
        def get(self, carrier: list[tuple[bytes, bytes]], key: str) -> list[str] | None:
            name = key.encode()
            values = [v.decode("latin-1") for k, v in carrier if k == name]
            return values or None

        def keys(self, carrier: list[tuple[bytes, bytes]]) -> list[str]:
            return [k.decode("latin-1") for k, _ in carrier]

    return HeaderGetter()


def _wall_ns(perf: float) -> int:
    """A time.perf_counter() reading as wall-clock nanoseconds (spans carry epoch times)."""
    return time.time_ns() - int((time.perf_counter() - perf) * 1e9)


class RequestTrace:
    """The spans and metrics of one request. The exchange (proxy/endpoint/exchange.py) calls: `routed` once the request
    is decoded and routed, `attempt` before each upstream attempt (with the attempt's headers, which get our
    traceparent), `attempt_failed` when an attempt fails before its response was accepted, `answering` with the
    accepted response's status and the Answer it fills, and `finish` once, at the very end. `output` (content
    capture only) is fed the answer's events."""

    def __init__(self, tel: Telemetry, headers: Any, route: str, started: float, request_id: str) -> None:
        self.tel = tel
        self.started = started
        self.request_id = request_id
        self.route = route
        self.trace_id: str | None = None  # the server span's ids, when it is sampled (for the access log line)
        self.span_id: str | None = None
        self.operation = "chat"
        self.provider = ""
        self.model = ""  # the client's model name
        self.upstream_model = ""
        self.metric_model = ""  # the bounded model name (metrics attributes)
        self.stream = False
        self.client: Any = None  # the open CLIENT span (the current attempt), or None
        self.client_t0 = 0.0
        self.client_attrs: dict[str, Any] = {}
        self.response_status: int | None = None
        self.ctx: RequestContext | None = None
        self.answer_ref: Answer | None = None
        self.output: Output | None = None
        self.attempts = 0
        tracer = tel.tracer
        if tracer is None:  # metrics only
            self.server: Any = None
            self.context: Any = None
            return
        parent = tel.propagator.extract(headers, getter=tel.getter)
        self.server = span = tracer.start_span(
            f"POST {route}", context=parent, kind=tel.SERVER, start_time=_wall_ns(started),
            attributes={"http.request.method": "POST", "http.route": route, "url.path": route,
                        "gen_ai.operation.name": "chat", "dialect_proxy.request_id": request_id})
        self.context = tel._trace.set_span_in_context(span)
        sc = span.get_span_context()
        if sc.is_valid:
            self.trace_id = format(sc.trace_id, "032x")
            self.span_id = format(sc.span_id, "016x")

    # -- the request ------------------------------------------------------------------------------------------

    def routed(self, request: dict[str, Any], ctx: RequestContext, dialect: str, metric_model: str) -> None:
        """The request (`request`: its hub form, or the body passed through) is decoded and routed."""
        self.operation = OPERATIONS.get(ctx.kind, ctx.kind)
        self.provider = dialect
        self.model = ctx.client_model
        self.upstream_model = ctx.upstream_model
        self.metric_model = metric_model
        self.stream = ctx.stream
        self.ctx = ctx
        span = self.server
        if span is None or not span.is_recording():
            return
        span.update_name(f"{self.operation} {ctx.client_model}")
        attrs = {"gen_ai.operation.name": self.operation, "gen_ai.provider.name": dialect,
                 "gen_ai.request.model": ctx.client_model, "dialect_proxy.upstream": ctx.upstream.name,
                 **_request_attributes(request, ctx.stream)}
        if self.tel.capture:
            attrs.update(_input_content(request, self.tel.redactor))
            self.output = Output()
        span.set_attributes(attrs)

    def attempt(self, replica: Replica, headers: dict[str, str]) -> None:
        """An upstream attempt starts: its CLIENT span, and its traceparent in the attempt's `headers`."""
        self.attempts += 1
        self.client_t0 = time.perf_counter()
        host, port = self.tel.address(replica.url)
        attrs: dict[str, Any] = {"gen_ai.operation.name": self.operation, "gen_ai.provider.name": self.provider,
                                 "gen_ai.request.model": self.upstream_model, "server.address": host,
                                 "dialect_proxy.replica": replica.name, "dialect_proxy.attempt": self.attempts}
        if port is not None:
            attrs["server.port"] = port
        self.client_attrs = attrs
        tracer = self.tel.tracer
        if tracer is None:
            return
        span = self.client = tracer.start_span(f"{self.operation} {self.upstream_model}", context=self.context,
                                               kind=self.tel.CLIENT, attributes=attrs)
        if span.get_span_context().is_valid:  # a sampled-out request still passes the client's decision on
            self.tel.propagator.inject(headers, context=self.tel._trace.set_span_in_context(span))

    def attempt_failed(self, failure: BaseException | int) -> None:
        """The attempt failed before its response was accepted (refused, timeout, HTTP 502/503): its span ends."""
        error = _error_type(failure)
        self._operation_metric(error)
        span = self.client
        if span is None:
            return
        if isinstance(failure, int):
            span.set_attribute("http.response.status_code", failure)
        span.set_attribute("error.type", error)
        span.set_status(self.tel._trace.Status(self.tel._trace.StatusCode.ERROR, error))
        span.end()
        self.client = None

    def answering(self, status: int, answer: Answer) -> None:
        """The attempt's response was accepted (its HTTP status); `answer` will hold what the answer says."""
        self.response_status = status
        self.answer_ref = answer
        if self.client is not None:
            self.client.set_attribute("http.response.status_code", status)

    def structured_attempt(self, number: int, way: str, problem: str | None) -> None:
        """An emulated structured-output attempt was checked (proxy/endpoint/structured.py): its span says how it
        was asked and whether it passed; a failing one's span ends here (the next attempt opens its own)."""
        span = self.client
        if span is None:
            return
        span.set_attributes({"dialect_proxy.structured.attempt": number, "dialect_proxy.structured.way": way,
                             "dialect_proxy.structured.valid": problem is None})
        if problem is not None:
            span.set_attribute("dialect_proxy.structured.error", problem[:500])
            span.end()
            self.client = None

    # -- the end ----------------------------------------------------------------------------------------------

    def finish(self, status: int, obs: RequestObserver | None, error: str | None = None,
               disconnected: bool = False) -> None:
        """The request is over (its answer sent, or not; `error`: the error code it ended with, `disconnected`: the
        client left): the spans end, the metrics are recorded."""
        try:
            self._finish(_Ending(status, _server_error(status, error, disconnected), disconnected,
                                 obs.ttft if obs is not None else None))
        except Exception:  # a bug of ours costs the request's telemetry, never the request
            log.exception("recording the trace of request %s failed", self.request_id)

    def _finish(self, end: _Ending) -> None:
        now = time.perf_counter()
        answer = self.answer_ref
        usage = _usage(answer.usage if answer is not None else None)
        if self.client is not None:
            self._end_client(end, usage)
        if self.client_t0:
            self._operation_metric(end.error, usage, answer, now)
        span = self.server
        if span is not None and span.is_recording():
            self._end_server(span, end, usage)
        if self.tel.instruments is not None and self.provider:
            self._request_metrics(end, usage, now)

    def _answer_attrs(self, end: _Ending, usage: dict[str, Any], ttft: float | None) -> dict[str, Any]:
        """The attributes every span of the answer has: usage, time to first chunk, error.type."""
        attrs = dict(usage)
        if self.stream and ttft is not None:
            attrs["gen_ai.response.time_to_first_chunk"] = ttft
        if end.error is not None:
            attrs["error.type"] = end.error
        return attrs

    def _end_span(self, span: Any, end: _Ending, attrs: dict[str, Any]) -> None:
        if end.error is not None and end.status >= 500:
            span.set_status(self.tel._trace.Status(self.tel._trace.StatusCode.ERROR, end.error))
        span.set_attributes(attrs)
        span.end()

    def _end_client(self, end: _Ending, usage: dict[str, Any]) -> None:
        """The answer's attributes on the CLIENT span: the upstream's view."""
        answer = self.answer_ref
        ttft = None if end.ttft is None else max(self.started + end.ttft - self.client_t0, 0.0)
        attrs = self._answer_attrs(end, usage, ttft)
        if answer is not None:
            if answer.upstream_id:
                attrs["gen_ai.response.id"] = answer.upstream_id
            if answer.upstream_model:
                attrs["gen_ai.response.model"] = answer.upstream_model
            if answer.finish_reason:
                attrs["gen_ai.response.finish_reasons"] = (answer.finish_reason,)
        self._end_span(self.client, end, attrs)
        self.client = None

    def _end_server(self, span: Any, end: _Ending, usage: dict[str, Any]) -> None:
        """The answer's attributes on the SERVER span: the client's view."""
        attrs = {"http.response.status_code": end.status, **self._answer_attrs(end, usage, end.ttft)}
        answer = self.answer_ref
        ctx = self.ctx
        if answer is not None and ctx is not None and end.error is None:
            # What the client's answer says (docs/decisions.md "Model names and ids in answers").
            keep = ctx.upstream.keep_upstream_id and answer.upstream_id and self.route.endswith("completions")
            attrs["gen_ai.response.id"] = answer.upstream_id if keep else ctx.response_id
            attrs["gen_ai.response.model"] = ctx.response_model
            if answer.finish_reason:
                attrs["gen_ai.response.finish_reasons"] = (answer.finish_reason,)
        if self.attempts > 1:
            attrs["dialect_proxy.retries"] = self.attempts - 1
        if end.disconnected:
            attrs["dialect_proxy.client_disconnected"] = True
        if self.output is not None and answer is not None:
            attrs["gen_ai.output.messages"] = self.output.render(answer.finish_reason, self.tel.redactor)
        self._end_span(span, end, attrs)

    def _request_metrics(self, end: _Ending, usage: dict[str, Any], now: float) -> None:
        """gen_ai.server.request.duration, and for a stream answered in full its time to first token and per output
        token."""
        instruments = self.tel.instruments
        assert instruments is not None
        base = {"gen_ai.operation.name": self.operation, "gen_ai.provider.name": self.provider,
                "gen_ai.request.model": self.metric_model}
        duration = now - self.started
        instruments.request_duration.record(duration, {**base, "error.type": end.error} if end.error else base)
        ttft = end.ttft
        if end.error is None and self.stream and ttft is not None:
            instruments.ttft.record(ttft, base)
            output = usage.get("gen_ai.usage.output_tokens", 0)
            if output > 1:
                instruments.tpot.record(max(duration - ttft, 0.0) / (output - 1), base)

    def _operation_metric(self, error: str | None, usage: dict[str, Any] | None = None, answer: Answer | None = None,
                          now: float | None = None) -> None:
        """gen_ai.client.operation.duration (per upstream attempt) and gen_ai.client.token.usage."""
        instruments = self.tel.instruments
        if instruments is None:
            return
        attrs = {"gen_ai.operation.name": self.operation, "gen_ai.provider.name": self.provider,
                 "gen_ai.request.model": self.metric_model}
        host_port = {k: v for k, v in self.client_attrs.items() if k in ("server.address", "server.port")}
        attrs.update(host_port)
        end = time.perf_counter() if now is None else now
        instruments.operation_duration.record(end - self.client_t0, {**attrs, "error.type": error} if error else attrs)
        if usage:
            for key, kind in (("gen_ai.usage.input_tokens", "input"), ("gen_ai.usage.output_tokens", "output")):
                if key in usage:
                    instruments.token_usage.record(usage[key], {**attrs, "gen_ai.token.type": kind})


def _error_type(failure: BaseException | int) -> str:
    """A failed attempt's error.type: the upstream's HTTP status, or what kept it from answering (as the
    upstream_attempts metric's `result`, deploy/METRICS.md)."""
    from proxy.errors import UpstreamTimeout, UpstreamUnreachable

    if isinstance(failure, int):
        return str(failure)
    if isinstance(failure, UpstreamTimeout):
        return "timeout"
    if isinstance(failure, UpstreamUnreachable):
        return "unreachable"
    code = getattr(failure, "code", None)
    return code if isinstance(code, str) and code else type(failure).__qualname__


class _Ending(NamedTuple):
    """How a request ended, for its spans and metrics."""

    status: int
    error: str | None  # error.type (None: no error)
    disconnected: bool
    ttft: float | None  # seconds from the request's start to its first token


def _server_error(status: int, code: str | None, disconnected: bool) -> str | None:
    if disconnected:
        return "client_disconnected"
    if code:
        return code
    return str(status) if status >= 400 else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    """gen_ai.usage.* from OpenAI-shaped usage (proxy/hub/events.py Answer.usage: the upstream's own counts)."""
    if not isinstance(usage, dict):
        return {}
    out: dict[str, Any] = {}
    prompt = _count(usage.get("prompt_tokens"))
    completion = _count(usage.get("completion_tokens"))
    if prompt is not None:
        out["gen_ai.usage.input_tokens"] = prompt
    if completion is not None:
        out["gen_ai.usage.output_tokens"] = completion
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    if cached is None:
        cached = _count(usage.get("prompt_cache_hit_tokens"))
    if cached is not None:
        out["gen_ai.usage.cache_read.input_tokens"] = cached
    details = usage.get("completion_tokens_details")
    reasoning = _count(details.get("reasoning_tokens")) if isinstance(details, dict) else None
    if reasoning is not None:
        out["gen_ai.usage.reasoning.output_tokens"] = reasoning
    return out


def _request_attributes(request: dict[str, Any], stream: bool) -> dict[str, Any]:
    """gen_ai.request.* from the hub request (Chat Completions names, whatever the client's dialect)."""
    attrs: dict[str, Any] = {"gen_ai.request.stream": stream}
    for name, key, kind in _PARAMS:
        value = request.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            attrs[key] = kind(value)
    limit = request.get("max_completion_tokens", request.get("max_tokens"))
    if isinstance(limit, int) and not isinstance(limit, bool):
        attrs["gen_ai.request.max_tokens"] = limit
    stop = request.get("stop")
    if isinstance(stop, str):
        attrs["gen_ai.request.stop_sequences"] = (stop,)
    elif isinstance(stop, list) and stop and all(isinstance(s, str) for s in stop):
        attrs["gen_ai.request.stop_sequences"] = tuple(stop)
    n = request.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and n != 1:
        attrs["gen_ai.request.choice.count"] = n
    fmt = request.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"):
        attrs["gen_ai.output.type"] = "json"
    return attrs


# -- content (opt-in) -------------------------------------------------------------------------------------------


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A hub message's parts in the conventions' form (docs/gen-ai/gen-ai-input-messages.json)."""
    parts: list[dict[str, Any]] = []
    if message.get("role") == "tool":
        parts.append({"type": "tool_call_response", "id": message.get("tool_call_id"),
                      "response": _text(message.get("content"))})
        return parts
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        parts.append({"type": "reasoning", "content": reasoning})
    text = _text(message.get("content"))
    if text:
        parts.append({"type": "text", "content": text})
    for call in message.get("tool_calls") or ():
        if isinstance(call, dict) and isinstance(call.get("function"), dict):
            parts.append({"type": "tool_call", "id": call.get("id"), "name": call["function"].get("name"),
                          "arguments": call["function"].get("arguments")})
    return parts


def _input_content(request: dict[str, Any], redactor: Redactor) -> dict[str, str]:
    system: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    raw = request.get("messages")
    if isinstance(raw, list):
        for message in raw:
            if not isinstance(message, dict):
                continue
            if message.get("role") in ("system", "developer"):
                system.append({"type": "text", "content": _text(message.get("content"))})
            else:
                messages.append({"role": message.get("role"), "parts": _parts(message)})
    elif isinstance(request.get("prompt"), str):
        messages.append({"role": "user", "parts": [{"type": "text", "content": request["prompt"]}]})
    out = {"gen_ai.input.messages": redactor.secrets(orjson.dumps(messages).decode())}
    if system:
        out["gen_ai.system_instructions"] = redactor.secrets(orjson.dumps(system).decode())
    tools = request.get("tools")
    if isinstance(tools, list) and tools:
        out["gen_ai.tool.definitions"] = redactor.secrets(orjson.dumps(tools).decode())
    return out


class Output:
    """The answer's text, reasoning and tool calls of choice 0, as the events pass (content capture only)."""

    __slots__ = ("calls", "reasoning", "text")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}

    def feed(self, events: Iterable[Delta]) -> None:
        for event in events:
            if event.index != 0:
                continue
            if event.reasoning:
                self.reasoning.append(event.reasoning)
            if event.content:
                self.text.append(event.content)
            for fragment in event.tool_calls or ():
                call = self.calls.setdefault(fragment.get("index", 0), {"type": "tool_call", "id": None,
                                                                        "name": None, "arguments": ""})
                if fragment.get("id"):
                    call["id"] = fragment["id"]
                function = fragment.get("function") or {}
                if function.get("name"):
                    call["name"] = function["name"]
                call["arguments"] += function.get("arguments") or ""

    def render(self, finish_reason: str | None, redactor: Redactor) -> str:
        parts: list[dict[str, Any]] = []
        if self.reasoning:
            parts.append({"type": "reasoning", "content": "".join(self.reasoning)})
        if self.text:
            parts.append({"type": "text", "content": "".join(self.text)})
        parts.extend(self.calls.values())
        message = {"role": "assistant", "parts": parts, "finish_reason": finish_reason or ""}
        return redactor.secrets(orjson.dumps([message]).decode())
