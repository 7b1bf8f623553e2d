"""The hub: the one form every request and answer passes through, between a client spoke and an upstream spoke.

    canonical.py   the hub form (OpenAI Chat Completions as plain dicts) and the per-request context
    events.py      the hub's typed events (`Delta`, finish, usage): an answer with every upstream quirk undone
    pipeline.py    one request's answer pipeline, without I/O: upstream bytes in, hub events out
    normalize.py   canonical chunks -> hub events (reasoning split, tool calls, usage), for any upstream
    continuity.py  reasoning continuity for upstreams that need an assistant turn's reasoning back
    params.py      parameters an upstream cannot honour: refused with a 400 that names them
    sse.py         server-sent events framing, both directions
    jsontext.py    JSON string tokens of text for the streams' hot paths
    readings.py    per-token numbers an upstream reports about its own work

May import: proxy.errors, proxy.build, proxy.settings, proxy.stream; the upstream session's base class
(proxy/dialects/base.py `UpstreamSession`, which the pipeline drives) only as a type, under TYPE_CHECKING: the
spokes import the hub. Never a client spoke, an upstream spoke's
module, the gateway, metrics or the server: the hub knows no dialect and does no I/O.
"""
