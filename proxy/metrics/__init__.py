"""What the proxy sees, exported: Prometheus metrics and OpenTelemetry traces.

    definitions.py every metric defined (one `Metrics` per app, its own registry) and the exposition
    observer.py    the per-request observer: label children resolved once, per-chunk calls that touch no label
    labels.py      the values a label may take and their bounds
    local.py       lock-free counters, gauges and histograms for one process
    files.py       multiprocess mode: a worker's values copied into prometheus_client's files
    tracing.py     OpenTelemetry spans and metrics in the GenAI semantic conventions
    model_server.py the Model Server Protocol gauges an Inference Gateway's Endpoint Picker reads (vllm:*), from the
                   engine's own metrics port and the admission's counts (docs/inference-gateway.md)

May import: proxy.errors, proxy.build, proxy.settings, the hub's events and readings, and the upstream-dialect
registry (the `dialect` label's values); other parts only as types. Called by the endpoint and the gateway, never
the other way round.
"""
