"""An inference engine's own load, read from its Prometheus metrics: requests waiting, requests running, the share of
its KV cache in use. The Model Server Protocol gauges (proxy/metrics/model_server.py, docs/inference-gateway.md) are
made from it.

A spoke whose engine exports such metrics declares their names (`Dialect.engine_metrics`, an `EngineMetricNames`):
MindIE's are in proxy/dialects/mindie.py. `read_engine_load` reads an exposition with those names; what it cannot read
is an `EngineMetricsError` naming the reason (a bounded word for the metric label, and a sentence for the log), never
a zero in place of a missing value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

# The reasons a reading fails: the `reason` label's values (proxy/metrics/model_server.py).
UNREACHABLE: Final = "unreachable"
HTTP_STATUS: Final = "http_status"
UNPARSABLE: Final = "unparsable"
MISSING: Final = "missing"
REASONS: Final = (UNREACHABLE, HTTP_STATUS, UNPARSABLE, MISSING)


class EngineMetricsError(Exception):
    """The engine's metrics could not be read: `reason` is one of REASONS, the message says what happened."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class EngineMetricNames:
    """Where an engine's exposition holds its load: three gauges, each labelled with the model's name."""

    waiting: str  # requests received, not yet scheduled
    running: str  # requests being generated
    kv_cache: str  # the KV cache's share in use, a fraction 0..1
    model_label: str = "model_name"


class EngineLoad:
    """One reading of the engine, for one model (the first the exposition names, when it names several). Made at each
    reading (several a second): its `__init__` is written out, for the compiled build (tests/test_build.py)."""

    __slots__ = ("kv_cache", "model", "running", "waiting")

    def __init__(self, model: str, waiting: float, running: float, kv_cache: float) -> None:
        self.model = model
        self.waiting = waiting
        self.running = running
        self.kv_cache = kv_cache


def read_engine_load(text: str, names: EngineMetricNames) -> EngineLoad:
    """The engine's load from its exposition, or EngineMetricsError (UNPARSABLE, MISSING) — a gauge it does not
    hold, or holds with a value that is not a finite number ≥ 0, is missing, never read as 0."""
    wanted = {names.waiting: "waiting", names.running: "running", names.kv_cache: "kv_cache"}
    found: dict[str, tuple[str, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            field = wanted.get(family.name)
            if field is None or field in found:
                continue
            for sample in family.samples:
                if sample.name == family.name and math.isfinite(sample.value) and sample.value >= 0:
                    found[field] = (sample.labels.get(names.model_label, ""), float(sample.value))
                    break
    except ValueError as e:
        raise EngineMetricsError(UNPARSABLE, f"the metrics are not Prometheus text: {e}") from None
    absent = [name for name, field in wanted.items() if field not in found]
    if absent:
        raise EngineMetricsError(MISSING, "the metrics lack " + ", ".join(absent))
    model = found["waiting"][0] or found["running"][0] or found["kv_cache"][0]
    return EngineLoad(model, found["waiting"][1], found["running"][1], found["kv_cache"][1])
