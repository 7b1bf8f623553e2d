"""A hostile upstream on a raw loopback socket: it answers each request with a scripted sequence of bytes, pauses,
closes and resets — things no well-behaved HTTP server library would send. The script is chosen by `case:NAME` in
the request body (the user message)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Sleep:
    seconds: float


CLOSE = "close"  # close the connection (FIN)
RESET = "reset"  # close with a TCP reset
# Keep the connection open until the next request on it has arrived, then close (FIN) or reset it without an answer:
# a server whose idle keep-alive timeout fired as the request crossed.
CLOSE_ON_NEXT = "close_on_next"
RESET_ON_NEXT = "reset_on_next"

Step = bytes | Sleep | str
Script = Sequence[Step]


def http(status: int, body: bytes, content_type: bytes = b"application/json", extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\n" % (status, content_type, len(body))
            + extra + b"\r\n" + body)


def sse_head(extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n" + extra + b"\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"
_CASE = re.compile(rb"case:([\w.-]+)")


class RawUpstream:
    """Runs in a thread with its own event loop; `url` is its base URL. Every connection is bounded: a script ends
    by closing, and a request that does not arrive within 10 s is dropped."""

    def __init__(self, cases: dict[str, Script]) -> None:
        self.cases = cases
        self.requests: list[bytes] = []  # the raw heads received (for assertions on headers)
        self.connections = 0  # connections accepted
        self.dropped: list[bytes] = []  # the heads of requests dropped by CLOSE_ON_NEXT / RESET_ON_NEXT
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> RawUpstream:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop)
        self._server = fut.result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self._server.wait_closed()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self.connections += 1
        try:
            head, body = await _read_request(reader)
            self.requests.append(head)
            match = _CASE.search(body) or _CASE.search(head)
            script = self.cases[match.group(1).decode()] if match else [http(200, b"{}"), CLOSE]
            for step in script:
                if isinstance(step, bytes):
                    writer.write(step)
                    await writer.drain()
                elif isinstance(step, Sleep):
                    await asyncio.sleep(step.seconds)
                elif step in (RESET, RESET_ON_NEXT, CLOSE_ON_NEXT):
                    if step != RESET:
                        self.dropped.append((await _read_request(reader))[0])
                    if step != CLOSE_ON_NEXT:
                        sock = writer.get_extra_info("socket")
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        writer.transport.abort()
                        return
                    break
                elif step == CLOSE:
                    break
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # (cancelled: `stop`, while a connection waits for its next request)
        finally:
            writer.close()


async def _read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request's head and body, within 10 s."""
    async with asyncio.timeout(10):
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"(?i)content-length:\s*(\d+)", head)
        body = await reader.readexactly(int(length.group(1))) if length else b""
    return head, body
