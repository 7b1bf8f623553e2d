"""Minimal ASGI response machinery: a response is a pre-built *plan* run by a disconnect-aware runner.

A plan is a list of steps, built entirely before the first byte goes out (all JSON is encoded up front with orjson,
so the per-chunk path is one `send`):

    (SLEEP, seconds)               wait, unless the client disconnects first
    (START, status, headers)       http.response.start
    (BODY, bytes, more_body)       http.response.body
    (CLOSE,)                       close the TCP connection abruptly (no response, or a truncated one)

While the plan runs, a watcher task awaits ASGI `receive()` for `http.disconnect`, so a client that goes away is
noticed at once, also while the mock sleeps before the headers or between chunks. The outcome is counted in
`Stats`: `completed` (the last body byte was handed to the server), `disconnects` (the client left first) or
neither (the mock itself dropped the connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import orjson

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

SLEEP, START, BODY, CLOSE = "sleep", "start", "body", "close"
Step = tuple[Any, ...]
Plan = list[Step]

SEND_KEY = "proxy.mock.raw_send"  # the server's own `send`, stored in the scope by the app (see server.py)
HANG_LIMIT = 120.0

JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
TEXT_HEADERS = [(b"content-type", b"text/plain; charset=utf-8")]


RECENT_REQUESTS = 32


@dataclass
class Stats:
    requests: int = 0
    completed: int = 0
    disconnects: int = 0
    in_flight: int = 0
    model_lists: int = 0  # GET of the model list (not an inference request)
    checks: int = 0  # the proxy's readiness checks (common.py CHECK_HEADER), not counted in the others
    seq: int = 0  # request sequence number (ids such as endpoint_common_N); not reset
    last_request: dict[str, Any] | None = None
    # the most recent inference requests, oldest first (GET /_mock/requests): what a client sent in a whole
    # conversation (tests/cli/test_codex.py reads Codex's compaction turn from it); bounded
    recent: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=RECENT_REQUESTS))
    created: int = field(default_factory=lambda: int(time.time()))
    # Server-wide directives (create_app(directives=...), POST /_mock/directives): applied to every inference
    # request on top of its own, to make one replica of several misbehave (common.py).
    directives: dict[str, str] = field(default_factory=dict)
    prefix: PrefixCache = field(default_factory=lambda: PrefixCache())

    def snapshot(self) -> dict[str, int]:
        return {"requests": self.requests, "completed": self.completed, "disconnects": self.disconnects,
                "in_flight": self.in_flight, "model_lists": self.model_lists, "checks": self.checks}

    def reset(self) -> None:
        self.requests = self.completed = self.disconnects = self.model_lists = self.checks = 0
        self.last_request = None
        self.recent.clear()
        self.prefix = PrefixCache()


class PrefixCache:
    """A model of an inference server's prefix (KV) cache, by whole messages: a request's cached part is its longest
    run of leading messages that an earlier request to this server also began with. Measured in characters of the
    JSON-encoded messages; the last 100,000 prefixes are remembered."""

    LIMIT = 100_000

    def __init__(self) -> None:
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self.requests = 0
        self.prompt_chars = 0
        self.cached_chars = 0

    def observe(self, messages: list[Any]) -> None:
        digest = hashlib.blake2b(digest_size=16)
        total = cached = 0
        hit = True
        keys = []
        for message in messages:
            encoded = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
            digest.update(encoded)
            key = digest.copy().digest()
            total += len(encoded)
            if hit and key in self._seen:
                cached += len(encoded)
                self._seen.move_to_end(key)
            else:
                hit = False
            keys.append(key)
        for key in keys:
            self._seen[key] = None
        while len(self._seen) > self.LIMIT:
            self._seen.popitem(last=False)
        self.requests += 1
        self.prompt_chars += total
        self.cached_chars += cached

    def snapshot(self) -> dict[str, int]:
        return {"requests": self.requests, "prompt_chars": self.prompt_chars, "cached_chars": self.cached_chars}


# ---------------------------------------------------------------------------------------------------------- plans

def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def body_plan(status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> Plan:
    hdrs = list(headers if headers is not None else JSON_HEADERS)
    hdrs.append((b"content-length", str(len(body)).encode()))
    return [(START, status, hdrs), (BODY, body, False)]


def json_plan(status: int, obj: Any, headers: list[tuple[bytes, bytes]] | None = None) -> Plan:
    return body_plan(status, orjson.dumps(obj), headers)


def drop_before_plan() -> Plan:
    return [(CLOSE,)]


def hang_plan(seconds: float) -> Plan:
    return [(SLEEP, min(max(seconds, 0.0), HANG_LIMIT)), (CLOSE,)]


def truncated_json_plan(body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> Plan:
    """`drop` on a non-stream request: headers promise the whole body, half of it arrives, then the socket closes."""
    hdrs = list(headers if headers is not None else JSON_HEADERS)
    hdrs.append((b"content-length", str(len(body)).encode()))
    return [(START, 200, hdrs), (BODY, body[:len(body) // 2], True), (CLOSE,)]


def stream_plan(head: list[bytes], body: list[bytes], tail: list[bytes], *, delay: float = 0.0,
                drop: int | None = None, stall: int | None = None, stall_seconds: float = HANG_LIMIT,
                raw_after: int | None = None, raw: bytes = b"", bad_json: bool = False,
                between: bytes | None = None, finish_in_body: bool = False,
                headers: list[tuple[bytes, bytes]] | None = None) -> Plan:
    """An SSE response: `head` frames, one frame per generated piece (`body`), then `tail` frames.

    delay: pause before every piece after the first, and before the tail.
    drop: send only the first `drop` pieces, then close the connection (never a finish chunk or [DONE]).
    stall: send the first `stall` pieces, then go silent (until the client leaves or `stall_seconds`), then close.
    raw_after: after that many pieces write `raw` (not SSE framed), then end the response.
    bad_json: a `data:` line with invalid JSON after the second piece.
    between: a frame (e.g. an SSE comment) after every piece.
    finish_in_body: the last body frame carries the finish (MindIE): `drop`/`raw_after` never send it.
    """
    plan: Plan = [(START, 200, list(headers if headers is not None else SSE_HEADERS))]
    plan += [(BODY, frame, True) for frame in head]
    limit = len(body) - 1 if finish_in_body and body else len(body)
    cut: int | None = None
    for value in (drop, stall, raw_after):
        if value is not None:
            cut = min(value, limit)
            break
    sent = body if cut is None else body[:cut]
    for i, frame in enumerate(sent):
        if i and delay:
            plan.append((SLEEP, delay))
        plan.append((BODY, frame, True))
        if between is not None:
            plan.append((BODY, between, True))
        if bad_json and i == min(1, len(body) - 1):
            plan.append((BODY, b'data: {"id": "mock-bad-json", "choices": [{"delta": \n\n', True))
    if drop is not None:
        plan.append((CLOSE,))
        return plan
    if stall is not None:
        plan += [(SLEEP, stall_seconds), (CLOSE,)]
        return plan
    if raw_after is not None:
        plan += [(BODY, raw, True), (BODY, b"", False)]
        return plan
    if delay and sent and tail:
        plan.append((SLEEP, delay))
    plan += [(BODY, frame, True) for frame in tail]
    if plan[-1][0] == BODY:
        plan[-1] = (BODY, plan[-1][1], False)
    else:
        plan.append((BODY, b"", False))
    return plan


# --------------------------------------------------------------------------------------------------------- runner

async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def _transport(scope: Scope) -> Any:
    """The server's transport behind this request (uvicorn's RequestResponseCycle keeps it), or None."""
    raw_send = scope.get(SEND_KEY)
    cycle = getattr(raw_send, "__self__", None)
    return getattr(cycle, "transport", None)


class PlanResponse:
    """An ASGI callable that runs a plan and accounts for it in `stats` (it owns one `in_flight` slot)."""

    __slots__ = ("plan", "stats")

    def __init__(self, plan: Plan, stats: Stats) -> None:
        self.plan = plan
        self.stats = stats

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        stats = self.stats
        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        outcome = "completed"
        try:
            for step in self.plan:
                op = step[0]
                if op is BODY:
                    if watcher.done():
                        outcome = "disconnect"
                        break
                    await send({"type": "http.response.body", "body": step[1], "more_body": step[2]})
                elif op is SLEEP:
                    done, _ = await asyncio.wait((watcher,), timeout=step[1])
                    if done:
                        outcome = "disconnect"
                        break
                elif op is START:
                    if watcher.done():
                        outcome = "disconnect"
                        break
                    await send({"type": "http.response.start", "status": step[1], "headers": step[2]})
                else:  # CLOSE
                    outcome = "dropped"
                    await self._close(scope, watcher)
                    break
        except asyncio.CancelledError:
            outcome = "disconnect"
            raise
        finally:
            if not watcher.done():
                watcher.cancel()
            stats.in_flight -= 1
            if outcome == "completed":
                stats.completed += 1
            elif outcome == "disconnect":
                stats.disconnects += 1

    @staticmethod
    async def _close(scope: Scope, watcher: asyncio.Future[None]) -> None:
        transport = _transport(scope)
        if transport is None:
            # Not under uvicorn: raising makes the server close the connection (or answer 500 if nothing was sent).
            raise ConnectionAbortedError("mock: abrupt close requested")
        transport.close()
        # Let the server notice the closed connection, so that it does not complain about an unfinished response.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(watcher), timeout=1.0)


class Noop:
    """An ASGI callable that sends nothing (the client is already gone)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        return None
