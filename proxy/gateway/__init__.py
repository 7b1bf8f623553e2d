"""The gateway: everything between a translated request and the upstream's socket.

    routing.py     model name -> upstream (aliases, model lists, the default route)
    replicas.py    an upstream's replicas: choosing one, failing over (the retry loop), keeping the sick out
    admission.py   at most `max_in_flight` requests per replica, then a bounded queue, fair across API keys
    keys.py        the inbound API keys and each one's policy (api_keys_file), read again on change or SIGHUP
    limits.py      the per-key limiter: admit against the counters (proxy/state/counters*.py), settle at the end
    upstream.py    the aiohttp client: one pooled session per upstream, failures classified
    health.py      a replica's readiness checks (/readyz, active health)
    catalog.py     an upstream's own model list, read once and kept
    redact.py      secrets and internal addresses out of any text that leaves the proxy

May import: proxy.errors, proxy.settings, proxy.state (the limit counters); dialects and metrics only as types (a
replica is handed its dialect and its metrics). Knows no client dialect and no hub event.
"""
