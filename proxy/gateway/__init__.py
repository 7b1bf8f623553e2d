"""The gateway: everything between a translated request and the upstream's socket.

    routing.py     model name -> upstream (aliases, model lists, the default route)
    replicas.py    an upstream's replicas: choosing one, failing over (the retry loop), keeping the sick out
    admission.py   at most `max_in_flight` requests per replica, then a bounded queue
    upstream.py    the aiohttp client: one pooled session per upstream, failures classified
    health.py      a replica's readiness checks (/readyz, active health)
    catalog.py     an upstream's own model list, read once and kept
    redact.py      secrets and internal addresses out of any text that leaves the proxy

May import: proxy.errors, proxy.settings; dialects and metrics only as types (a replica is handed its dialect and its
metrics). Knows no client dialect and no hub event.
"""
