"""Draining as documented (issue 12, defect 8; proxy/server/process.py, docs/decisions.md "Operations"): after SIGTERM
an idle kept-alive connection is closed without an answer, new connections are refused, and the stream in flight
finishes with [DONE]. The real CLI process, on loopback."""

from __future__ import annotations

import asyncio
import signal

import orjson

from tests.hostile.test_hostile_clients import closed, read_answer, request_bytes
from tests.test_shutdown import start_cli


def test_sigterm_closes_idle_kept_alive_connections_and_lets_the_stream_finish(start_mock):
    mock = start_mock("openai")
    proc, url = start_cli(mock.url, 10.0)
    port = int(url.rsplit(":", 1)[1])
    stream_body = orjson.dumps({"model": "m", "stream": True, "messages": [
        {"role": "user", "content": "[mock:chunks=20][mock:delay_ms=100]"}]})

    async def main() -> tuple[bytes, bool, bool, bytes]:
        idle_r, idle_w = await asyncio.open_connection("127.0.0.1", port)
        idle_w.write(request_bytes())
        assert (await read_answer(idle_r))[0] == 200  # kept alive now, idle
        s_r, s_w = await asyncio.open_connection("127.0.0.1", port)
        s_w.write(request_bytes(body=stream_body))
        head = await s_r.readuntil(b"\r\n\r\n")
        assert b" 200 " in head.split(b"\r\n")[0]
        proc.send_signal(signal.SIGTERM)
        # The idle connection: closed, and not a byte of answer on it.
        async with asyncio.timeout(10):
            leftover = await idle_r.read()
        idle_closed = await closed(idle_r, 1)
        # New connections: refused once the listener is closed (bounded polling).
        refused = False
        for _ in range(50):
            try:
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
            except OSError:
                refused = True
                break
            await asyncio.sleep(0.1)
        async with asyncio.timeout(20):
            rest = await s_r.read()  # the stream runs to its end, then the connection closes
        s_w.close()
        idle_w.close()
        return leftover, idle_closed, refused, rest

    try:
        leftover, idle_closed, refused, rest = asyncio.run(main())
        assert leftover == b"" and idle_closed
        assert refused
        assert b"data: [DONE]" in rest
        assert proc.wait(timeout=15) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
