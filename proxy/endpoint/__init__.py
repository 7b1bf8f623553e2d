"""The endpoints: glue only, between the front end and the spokes.

    inference.py    InferenceEndpoint, one per client dialect's path: its HTTP transport (`serve_http`, every
                    endpoint's), and `serve` for any transport (a request and a sink)
    exchange.py     Exchange: one request whatever its transport and path — the endpoint decodes or passes
                    through, routes and serves; the errors before the answer, a bug of ours, the client leaving, the
                    shutdown grace; metrics, trace and the access log line at its end
    translate.py    the translated path: upstream session -> send (gateway) -> pipeline (hub) -> encode (client
                    spoke) -> relay; a whole body is the same path fed once
    passthrough.py  the other path: a request an upstream speaks natively goes to it untranslated (NativeCall)
    retrieval.py    the third: embeddings and rerank (RetrievalEndpoint), the inputs sent in batches (Batches), the
                    joined answer whole
    relay.py        Relay: the answer's stream for translation and passthrough — the head committed once,
                    keep-alives, the error after the head, truncation, usage
    sink.py         Sink, where an answer goes (the transport frames it); HttpSink: SSE, one JSON body, an error
                    response
    record.py       AccessRecord: the access log line as typed fields, written out once
    request.py      the request's edge: its id, its body (bounded, parsed once), response ids, the client
                    disconnect watch

May import: proxy.errors, proxy.settings, the hub, the client spokes and the gateway (the disconnect hook's scope key is
this part's, request.py, and the front end fills it);
metrics, traces and AppState only as types (the app hands them in). Never an upstream spoke's module by name: the
route says which spoke serves a request.
"""
