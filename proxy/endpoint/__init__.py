"""The inference endpoint: glue only, between the front end and the spokes.

    inference.py    InferenceEndpoint, one per client dialect's path: decode (client spoke) -> route -> upstream
                    session -> send (gateway) -> pipeline (hub) -> encode (client spoke) -> write or fold
    passthrough.py  the other path: a request an upstream speaks natively goes to it untranslated, with the same
                    routing, limits, retries, metrics and access log
    request.py      the request's edge: its id, its body (bounded, parsed once), response ids, the client
                    disconnect watch

May import: proxy.errors, proxy.settings, the hub, the client spokes, the gateway, and the front end's disconnect hook;
metrics, traces and AppState only as types (the app hands them in). Never an upstream spoke's module by name: the
route says which spoke serves a request.
"""
