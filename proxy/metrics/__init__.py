"""What the proxy sees, exported: Prometheus metrics and OpenTelemetry traces.

    prometheus.py  metric definitions (one `Metrics` per app) and the per-request observer
    local.py       lock-free counters, gauges and histograms for one process
    files.py       multiprocess mode: a worker's values copied into prometheus_client's files
    tracing.py     OpenTelemetry spans and metrics in the GenAI semantic conventions

May import: proxy.errors, proxy.build, proxy.settings, the hub's events and readings, and the upstream-dialect
registry (the `dialect` label's values); other parts only as types. Called by the endpoint and the gateway, never
the other way round.
"""
