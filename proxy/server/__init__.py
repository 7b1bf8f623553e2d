"""The process and its front end: what turns sockets into ASGI calls and back.

    process.py    the uvicorn server the CLI runs, graceful drain on SIGTERM
    frontend.py   the HTTP/1.1 connection protocol (httptools parser), with the proxy's own limits
    websocket.py  the WebSocket half of the front end (a connection the HTTP protocol hands over)
    responses_socket.py  the Responses API's WebSocket mode: each message one exchange of the inference endpoint,
                  its events one message each (SocketSink)
    asgi.py       the ASGI entry: inference endpoints called directly, everything else through Starlette
    app.py        create_app: the Starlette app, its lifespan (aiohttp sessions, state store, telemetry)
    appstate.py   AppState: everything a request needs, built once per process
    runtime.py    the garbage collector set for a server
    logs.py       the process's log: one JSON object per line, uvicorn's lines and libraries' warnings included

The top of the tree: may import every other part (endpoint, clients, dialects, gateway, hub, metrics, state,
settings). Nothing below imports it, except AppState as a type. Uses no private module of another package.
"""
