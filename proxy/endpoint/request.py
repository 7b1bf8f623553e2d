"""The edge of an inference request: what the endpoint reads before any dialect is involved and what it needs to
know while it answers — the request id (the client's x-request-id, or a new one), the body (bounded, parsed once, its
nesting checked), response ids, and the watch that cancels the request when the client goes away.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
from typing import Any, Final

import orjson

from proxy.clients.validate import check_depth
from proxy.errors import ClientRequestError

# The scope key of the handler's disconnect callback: the front end (proxy/server/frontend.py) puts it, None, in the
# scope of every request it serves and calls what the handler set there from `connection_lost`.
DISCONNECT_HOOK: Final = "dialect_proxy.on_disconnect"

# Functions of other modules called per request, as statics (compiled: no module attribute looked up per call)
_current_task: Final = asyncio.current_task
_ensure_future: Final = asyncio.ensure_future
_running_loop: Final = asyncio.get_running_loop
_loads: Final = orjson.loads

Scope = dict[str, Any]
JSON_HEADERS: Final = [(b"content-type", b"application/json")]
# An event stream's own headers: not cached, not buffered by a proxy in front (nginx reads X-Accel-Buffering).
SSE_HEADERS: Final = [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


class Disconnect:
    """Cancels the request's task when the client goes away. Under the proxy's own front end (proxy/server/frontend.py)
    the connection calls `lost` directly; under any other server a watcher task reads `receive()` for
    `http.disconnect`; a transport that learns it by itself (a WebSocket connection) calls `lost` (no `receive`, no
    `scope`)."""

    __slots__ = ("_scope", "_task", "_watcher", "complete", "disconnected", "loop")

    def __init__(self, receive: Any = None, scope: Scope | None = None) -> None:
        self.disconnected = False
        self.complete = False  # set just before the final send: uvicorn then answers receive() with a disconnect
        self._task = task = _current_task()
        # The request's loop, for the calls below that need one: taken from its task (asyncio.get_running_loop is a
        # getpid system call on Python 3.11, three a request saved).
        self.loop = task.get_loop() if task is not None else _running_loop()
        self._scope: Scope | None = None
        self._watcher: asyncio.Future[None] | None = None
        if scope is not None and DISCONNECT_HOOK in scope:
            scope[DISCONNECT_HOOK] = self.lost
            self._scope = scope
        elif receive is not None:
            self._watcher = _ensure_future(self._watch(receive))

    async def _watch(self, receive: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.lost()
                return

    def lost(self) -> None:
        """The client went away: the request's task is cancelled, unless its answer is complete."""
        if not self.complete and not self.disconnected and self._task is not None:
            self.disconnected = True
            self._task.cancel()

    def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        if self._scope is not None:
            self._scope[DISCONNECT_HOOK] = None


class ClientGone(Exception):
    """The client went away before its request body was complete."""


def scan_headers(headers: Any) -> tuple[bytes, bytes]:
    """The request's x-request-id and content-length (b"" for none), in one pass over its headers (as the ASGI
    server lists them: lower-case names): the first of each."""
    rid: bytes | None = None
    length: bytes | None = None
    for item in headers:
        key = item[0]  # an index, not an unpacking (compiled: no iterator per header)
        if key == b"x-request-id":
            if rid is None:
                rid = item[1]
                if length is not None:
                    break
        elif key == b"content-length" and length is None:
            length = item[1]
            if rid is not None:
                break
    return rid or b"", length or b""


async def read_request_body(length: bytes, receive: Any, limit: int) -> bytes:
    """The request body (`length`: its content-length header, b"" for none), refused (413) beyond `limit`."""
    if length.isdigit() and int(length) > limit:
        raise ClientRequestError(
            f"The request body is {int(length)} bytes; the limit is {limit} bytes.", 413, code="request_too_large"
        )
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        body = message.get("body", b"")
        if body:
            size += len(body)
            if size > limit:
                raise ClientRequestError(
                    f"The request body is larger than the limit of {limit} bytes.", 413, code="request_too_large"
                )
            chunks.append(body)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def send_json(send: Any, status: int, payload: bytes, extra: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": JSON_HEADERS + extra})
    await send({"type": "http.response.body", "body": payload})



def parse_body(body: bytes) -> dict[str, Any]:
    try:
        req = _loads(body)
    except orjson.JSONDecodeError as e:
        raise ClientRequestError(f"The request body is not valid JSON ({e}).", code="invalid_json") from None
    if not isinstance(req, dict):
        raise ClientRequestError("The request body must be a JSON object.", code="invalid_json")
    check_depth(req, size=len(body))  # before anything serialises it: orjson parses 1024 levels but serialises only 254
    return req


_CONTROL: Final = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


# Request ids the proxy makes: unique, not secret (they are logged and returned), so a random prefix per process and
# a counter (no system call per request). Response ids, which name stored responses, stay random
# (proxy/endpoint/inference.py: os.urandom).
_ID_PREFIX: Final = os.urandom(8).hex()
_id_counter: Final = itertools.count(1)


def _new_request_id() -> str:
    # The counter in decimal: compiled, str() of an int is a C conversion, where a hex format spec is a generic
    # str.format call.
    return _ID_PREFIX + str(next(_id_counter))


def take_request_id(raw: bytes) -> tuple[str, bytes]:
    """The client's x-request-id `raw` (or a new one, for b""): as text for logs and the upstream header, and as the
    bytes to return. Valid UTF-8 reaches the upstream byte for byte (aiohttp writes header text as UTF-8); other bytes
    as U+FFFD. Cut to 200 bytes (at a character boundary); control characters (which no header may carry) get a new
    id instead."""
    if not raw:
        rid = _new_request_id()
        return rid, rid.encode()
    if len(raw) > 200:
        cut = 200
        while cut > 196 and 0x80 <= raw[cut] < 0xC0:  # the cut falls inside a UTF-8 character: cut before it
            cut -= 1
        raw = raw[:cut]
    if not raw.strip() or _CONTROL.search(raw):
        rid = _new_request_id()
        return rid, rid.encode()
    return raw.decode("utf-8", "replace"), raw
