"""The upstream of `make bench-felt` (tests/bench/felt.py): the built-in mock's own answers replayed, paced, from C
parsers and one event loop, so the upstream is never what limits a relay.

    python tests/bench/felt_mock.py PORT ANSWERS_DIR PACE_MS

ANSWERS_DIR holds `plain` (a non-stream answer's body) and `stream` (a streamed answer's body, server-sent events),
captured from `dialect-proxy mock` at the start of the run (felt.py `capture`), so each dialect's wire format is the
mock's. Any POST is answered: with the stream when its body asks `"stream": true`, else with the non-stream body
at once (the board's "instant mock" for added latency and the throughput frontier). A stream sends its head events
(before the first token) at once, then each token's event PACE_MS after the previous one, on the loop's timer,
from an absolute schedule (no drift); the events after the last token go with it. Any GET answers 200 (health).

Why not `dialect-proxy mock` itself: it is a Starlette app with its scenario machinery, and costs about as much CPU
per request and per event as the relays it would feed; on this 2-core machine it would be the bottleneck of the
direct row. httptools (uvicorn's parser) and uvloop keep this one at a few µs per request and per event.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys

import httptools
import uvloop

STREAM_ASKED = re.compile(rb'"stream"\s*:\s*true')
TOKEN = re.compile(rb"tok\d")  # the mock's text tokens are "tok0", " tok1", ...: an event with one is a content frame


def load_answers(directory: str) -> tuple[bytes, list[bytes]]:
    """The non-stream response (head and body) and the stream as its paced writes: [head, token 1, ..., last]."""
    with open(os.path.join(directory, "plain"), "rb") as f:
        plain = f.read()
    with open(os.path.join(directory, "stream"), "rb") as f:
        events = [e + b"\n\n" for e in f.read().split(b"\n\n") if e.strip()]
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(plain)
    tokens = [i for i, event in enumerate(events) if TOKEN.search(event)]
    first, last = tokens[0], tokens[-1]
    writes = [b"".join(events[:first]), *events[first:last], b"".join(events[last:])]
    return head + plain, [chunk(w) if w else b"" for w in writes]


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n" \
              b"transfer-encoding: chunked\r\n\r\n"
HEALTH = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok"


class Upstream(asyncio.Protocol):
    plain: bytes = b""
    stream: list[bytes] = []
    pace: float = 0.02

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.parser = httptools.HttpRequestParser(self)
        self.body = b""
        self.busy = False  # a stream is being sent: a pipelined request waits (clients here do not pipeline)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        method = self.parser.get_method()
        body, self.body = self.body, b""
        if method != b"POST":
            self.transport.write(HEALTH)
        elif STREAM_ASKED.search(body):
            self.send_stream()
        else:
            self.transport.write(self.plain)

    def send_stream(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        self.transport.write(STREAM_HEAD + self.stream[0])
        for k, write in enumerate(self.stream[1:], 1):
            loop.call_at(start + k * self.pace, self.write, write, k == len(self.stream) - 1)

    def write(self, data: bytes, last: bool) -> None:
        if self.transport.is_closing():
            return
        self.transport.write(data + b"0\r\n\r\n" if last else data)


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Upstream, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    Upstream.plain, Upstream.stream = load_answers(sys.argv[2])
    Upstream.pace = float(sys.argv[3]) / 1000
    uvloop.run(serve(int(sys.argv[1])))
