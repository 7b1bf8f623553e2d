"""A tiny OTLP/HTTP receiver on loopback: it takes what the proxy's OpenTelemetry exporters send (protobuf, decoded
with the OTLP schema of the opentelemetry-proto package) and keeps the spans and metric points for tests to read."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.conftest import ServerThread

KINDS = {1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


def value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, which) if which else None


@dataclass
class Span:
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    start: int
    end: int
    status: int  # 0 unset, 1 ok, 2 error
    attributes: dict[str, Any]
    resource: dict[str, Any] = field(default_factory=dict)


class Receiver:
    """POST /v1/traces and /v1/metrics; `spans` and `points` (metric name -> [(attributes, data point)])."""

    def __init__(self, port: int | None = None) -> None:
        self.spans: list[Span] = []
        self.points: dict[str, list[tuple[dict[str, Any], Any]]] = {}
        self.requests = 0
        self._lock = threading.Lock()
        app = Starlette(routes=[Route("/v1/traces", self._traces, methods=["POST"]),
                                Route("/v1/metrics", self._metrics, methods=["POST"])])
        self.srv = ServerThread(app, port=port)
        self.port = self.srv.port
        self.url = self.srv.url

    def start(self) -> Receiver:
        self.srv.start()
        return self

    def stop(self) -> None:
        self.srv.stop()

    async def _body(self, request: Request) -> bytes:
        raw = await request.body()
        return gzip.decompress(raw) if request.headers.get("content-encoding") == "gzip" else raw

    async def _traces(self, request: Request) -> Response:
        message = ExportTraceServiceRequest()
        message.ParseFromString(await self._body(request))
        with self._lock:
            self.requests += 1
            for rs in message.resource_spans:
                resource = {kv.key: value(kv.value) for kv in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.spans.append(Span(
                            name=s.name, kind=KINDS.get(s.kind, str(s.kind)), trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(), parent_id=s.parent_span_id.hex(),
                            start=s.start_time_unix_nano, end=s.end_time_unix_nano, status=s.status.code,
                            attributes={kv.key: value(kv.value) for kv in s.attributes}, resource=resource))
        return Response(ExportTraceServiceResponse().SerializeToString(), media_type="application/x-protobuf")

    async def _metrics(self, request: Request) -> Response:
        message = ExportMetricsServiceRequest()
        message.ParseFromString(await self._body(request))
        with self._lock:
            for rm in message.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        data = getattr(m, m.WhichOneof("data"))
                        for point in data.data_points:
                            attrs = {kv.key: value(kv.value) for kv in point.attributes}
                            self.points.setdefault(m.name, []).append((attrs, point))
        return Response(ExportMetricsServiceResponse().SerializeToString(), media_type="application/x-protobuf")

    def trace(self, trace_id: str) -> list[Span]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]
