"""The load of `make bench-felt` (tests/bench/felt.py): wrk for requests (C: the throughput frontier and the added
latency), and a stream client on bare asyncio protocols (uvloop) that timestamps every content frame.

The stream client parses the response itself (status line, headers, chunked framing) and counts a frame per token of
the mock's text ("tok0", " tok1", ...: tests/bench/felt_mock.py) the first time it arrives, whatever the client
dialect wraps it in (a chat chunk, a Messages `content_block_delta`, MindIE's cumulative full text that repeats the
text so far): a frame is lost when its text never arrives. A read (or an event) that carries several tokens gives
them one time: coalescing shows as a gap of 0 after a longer one. Each connection is kept alive for the slot's next
stream. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

TOKEN = re.compile(rb"tok(\d+)")  # the mock's text tokens ("tok0", " tok1"; not "output_tokens")
KEY = "sk-bench"  # every request carries it: LiteLLM's proxy refuses to start without a master key

REQUESTS = {  # client dialect: (path, body of one prompt)
    "chat": ("/v1/chat/completions", {"model": "bench", "messages": [{"role": "user", "content": "bench"}]}),
    "messages": ("/v1/messages", {"model": "bench", "max_tokens": 1024,
                                  "messages": [{"role": "user", "content": "bench"}]}),
}


def request_bytes(api: str, stream: bool, port: int) -> bytes:
    path, body = REQUESTS[api]
    payload = json.dumps({**body, "stream": stream}).encode()
    return (f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
            f"anthropic-version: 2023-06-01\r\nauthorization: Bearer {KEY}\r\n"
            f"content-length: {len(payload)}\r\n\r\n").encode() + payload


# ------------------------------------------------------------------------------------------------------------ wrk

@dataclass
class Rung:
    """One wrk run at one concurrency."""

    concurrency: int
    rps: float
    p50_us: float
    p99_us: float
    errors: int


WRK_SCRIPT = """wrk.method = "POST"
wrk.path = "{path}"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["anthropic-version"] = "2023-06-01"
wrk.headers["Authorization"] = "Bearer {key}"
wrk.body = '{body}'
"""
UNITS = {"us": 1.0, "ms": 1e3, "s": 1e6}


def wrk_script(api: str) -> str:
    path, body = REQUESTS[api]
    fd, name = tempfile.mkstemp(prefix="felt-wrk-", suffix=".lua")
    with os.fdopen(fd, "w") as f:
        f.write(WRK_SCRIPT.format(key=KEY, path=path, body=json.dumps({**body, "stream": False})))
    return name


def wrk(url: str, script: str, concurrency: int, seconds: float) -> Rung:
    """One closed-loop wrk run: `concurrency` keep-alive connections for `seconds` (whole seconds, at least 1)."""
    secs = max(1, round(seconds))
    done = subprocess.run(["wrk", "-t1", f"-c{concurrency}", f"-d{secs}s", "--timeout", "2s", "--latency",
                           "-s", script, url], capture_output=True, text=True, timeout=secs + 30)
    out = done.stdout
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if rps is None:
        raise RuntimeError(f"wrk: {done.stderr or out}")
    errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    errors += sum(int(n) for n in re.findall(r"Non-2xx or 3xx responses: (\d+)", out))
    return Rung(concurrency, float(rps.group(1)), _percentile(out, "50%"), _percentile(out, "99%"), errors)


def _percentile(out: str, label: str) -> float:
    m = re.search(rf"^\s+{label}\s+([\d.]+)(us|ms|s)\s*$", out, re.MULTILINE)
    return float(m.group(1)) * UNITS[m.group(2)] if m else math.nan


# --------------------------------------------------------------------------------------------------- the streams

@dataclass
class Stream:
    start: float
    frames: list[float] = field(default_factory=list)
    status: int = 0
    complete: bool = False


def last_token(event: bytes) -> int:
    """The number of the last token ("tok12" -> 12) in an event, -1 if none."""
    end = len(event)
    while (at := event.rfind(b"tok", 0, end)) >= 0:
        m = TOKEN.match(event, at)
        if m is not None:
            return int(m.group(1))
        end = at
    return -1


class _Conn(asyncio.Protocol):
    """One keep-alive client connection; `exchange` sends a request and waits for its whole answer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] | None = None
        self.stream: Stream | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    def exchange(self, request: bytes, stream: Stream) -> asyncio.Future[None]:
        assert self.transport is not None
        self.done = asyncio.get_running_loop().create_future()
        self.stream, self.head, self.buf, self.left, self.chunked, self.tail = stream, b"", b"", -1, False, b""
        self.seen = -1  # the highest token of the text seen so far
        self.transport.write(request)
        return self.done

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self.stream is None:
            return
        if not self.head:
            self.buf += data
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            self.head, data, self.buf = self.buf[:end].lower(), self.buf[end + 4:], b""
            if not self.head.startswith(b"http/1.1 ") or not self.head[9:12].isdigit():
                self._broken()  # not an answer's head: the stream fails, the connection goes
                return
            self.stream.status = int(self.head[9:12])
            self.chunked = b"transfer-encoding: chunked" in self.head
            length = re.search(rb"content-length: (\d+)", self.head)
            self.left = int(length.group(1)) if length else -1
        body = self._body(data)
        events = (self.tail + body).split(b"\n\n")
        self.tail = events.pop()  # an event not yet whole
        found = 0
        for event in events:
            last = last_token(event)
            if last > self.seen:
                found += last - self.seen
                self.seen = last
        self.stream.frames.extend([now] * found)
        if self.stream.complete and self.done is not None and not self.done.done():
            self.done.set_result(None)

    def _broken(self) -> None:
        if self.transport is not None:
            self.transport.close()
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    def _body(self, data: bytes) -> bytes:
        """The payload bytes of this read (chunked framing taken off); marks the answer complete at its end."""
        assert self.stream is not None
        if not self.chunked:
            self.left -= len(data)
            self.stream.complete = self.left <= 0
            return data
        self.buf += data
        out = []
        while True:
            if self.left <= 0:  # at a chunk's size line (or the CRLF after the previous chunk)
                if self.left == 0:
                    if len(self.buf) < 2:
                        break
                    self.buf, self.left = self.buf[2:], -1
                end = self.buf.find(b"\r\n")
                if end < 0:
                    break
                size = int(self.buf[:end].split(b";")[0], 16)
                if size == 0:
                    self.stream.complete = True
                    break
                self.buf, self.left = self.buf[end + 2:], size
            take = self.buf[:self.left]
            out.append(take)
            self.buf, self.left = self.buf[len(take):], self.left - len(take)
            if self.left:
                break
        return b"".join(out)


class Client:
    """Streams (or requests) through one relay, `concurrency` slots each on its own keep-alive connection."""

    def __init__(self, port: int, api: str, stream: bool = True, timeout: float = 30.0) -> None:
        self.port, self.stream, self.timeout = port, stream, timeout
        self.request = request_bytes(api, stream, port)

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(loop.create_connection(_Conn, "127.0.0.1", self.port), self.timeout)
        return conn

    async def one(self, conn: _Conn | None) -> tuple[Stream, _Conn | None]:
        """One answer; the connection to reuse (None after an error or a close)."""
        stream = Stream(time.perf_counter())
        try:
            if conn is None or conn.closed:
                conn = await self._connect()
            await asyncio.wait_for(asyncio.shield(conn.exchange(self.request, stream)), self.timeout)
        except (OSError, TimeoutError):
            if conn is not None and conn.transport is not None:
                conn.transport.close()
            return stream, None
        if conn.closed or not stream.complete:
            return stream, None
        return stream, conn

    async def run(self, concurrency: int, seconds: float, max_each: int = 10**6) -> list[Stream]:
        """`concurrency` slots making answers back to back until `seconds` are up (an answer begun is finished)."""
        out: list[Stream] = []
        stop_at = time.perf_counter() + seconds

        async def slot() -> None:
            conn = None
            for _ in range(max_each):
                if time.perf_counter() >= stop_at:
                    break
                stream, conn = await self.one(conn)
                out.append(stream)
            if conn is not None and conn.transport is not None:
                conn.transport.close()

        await asyncio.gather(*(slot() for _ in range(concurrency)))
        return out


# ------------------------------------------------------------------------------------------------ their figures

def pct(values: list[float], p: float) -> float:
    if not values:
        return math.nan
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


@dataclass
class StreamFigures:
    streams: int
    failed: int  # not 200, not complete, or not every frame
    stalled: int  # a gap (or the wait for the first frame) past the stall bound
    ttft: list[float]
    gaps: list[float]
    frames: int
    seconds: float

    @property
    def fps(self) -> float:
        return self.frames / self.seconds if self.seconds else 0.0


def figures(streams: list[Stream], frames: int, stall: float, seconds: float) -> StreamFigures:
    ttft: list[float] = []
    gaps: list[float] = []
    failed = stalled = total = 0
    for s in streams:
        total += len(s.frames)
        if s.status != 200 or not s.complete or len(s.frames) != frames:
            failed += 1
            continue
        ttft.append(s.frames[0] - s.start)
        mine = [b - a for a, b in zip(s.frames, s.frames[1:], strict=False)]
        gaps += mine
        if max([ttft[-1], *mine]) > stall:
            stalled += 1
    return StreamFigures(len(streams), failed, stalled, ttft, gaps, total, seconds)
