"""The front end writes a response's head together with its first body bytes (proxy/frontend.py _HeadWithBody): one
write for a non-stream answer instead of two. What must not change: HEAD answers (no body bytes), `100 Continue`
(sent before the client sends its body), keep-alive and pipelined requests, streams."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from proxy.frontend import _HeadWithBody
from tests.hostile.test_hostile_clients import port_of, read_answer, request_bytes


class Recorder(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


def test_head_goes_out_with_the_first_body_bytes_then_writes_pass() -> None:
    out = Recorder()
    t = _HeadWithBody(out)
    t.write(HEAD)
    assert out.writes == []
    t.write(b"ok")
    t.write(b"more")
    assert out.writes == [HEAD + b"ok", b"more"]
    t.next_response()  # the response is complete; the next one's head is held again
    t.write(HEAD)
    t.write(b"ok")
    assert out.writes == [HEAD + b"ok", b"more", HEAD + b"ok"]


def test_a_head_without_body_goes_out_when_the_response_completes_or_the_connection_closes() -> None:
    out = Recorder()
    t = _HeadWithBody(out)
    t.write(HEAD)
    t.next_response()
    assert out.writes == [HEAD]
    t.write(HEAD)
    t.close()
    assert out.writes == [HEAD, HEAD] and out.closed


def test_100_continue_is_never_held() -> None:
    out = Recorder()
    t = _HeadWithBody(out)
    t.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert out.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    t.write(HEAD)
    t.write(memoryview(b"ok"))
    assert out.writes[1:] == [HEAD + b"ok"]


@pytest.fixture
def proxy(start_mock: Any, start_proxy: Any) -> Any:
    return start_proxy(mock=start_mock("mindie", full_text=True), aliases={"m": "mock-model"})


def test_pipelined_requests_on_one_connection_keep_their_answers(proxy: Any) -> None:
    """A non-stream answer, a HEAD, a GET and a stream, sent in one write on one kept-alive connection: each answer
    complete and in order (a held head never leaks into the next answer); then a HEAD with nothing after it is
    answered at once (its head is not held for body bytes that never come)."""
    stream = orjson.dumps({"model": "m", "stream": True,
                           "messages": [{"role": "user", "content": "hi [mock:chunks=5]"}]})

    async def go() -> list[tuple[int, dict[str, str], bytes]]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(proxy))
        writer.write(request_bytes()
                     + b"HEAD /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
                     + b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
                     + request_bytes(body=stream))
        await writer.drain()
        answers = [await read_answer(reader)]
        async with asyncio.timeout(15):  # HEAD: the head alone (its content-length describes a GET's body)
            head = await reader.readuntil(b"\r\n\r\n")
        answers.append((int(head.split()[1]), {}, b""))
        answers += [await read_answer(reader), await read_answer(reader)]
        writer.write(b"HEAD /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")  # the last request: nothing follows it
        async with asyncio.timeout(15):
            head = await reader.readuntil(b"\r\n\r\n")
        answers.append((int(head.split()[1]), {}, b""))
        writer.close()
        return answers

    (s1, _, b1), (s2, _, _), (s3, _, b3), (s4, h4, b4), (s5, _, _) = asyncio.run(go())
    assert s1 == 200 and s5 == 200 and orjson.loads(b1)["choices"][0]["message"]["content"]
    assert s2 == 200
    assert s3 == 200 and orjson.loads(b3)["status"] == "ok"
    assert s4 == 200 and h4["content-type"].startswith("text/event-stream")
    assert b4.rstrip().endswith(b"data: [DONE]") and b4.count(b'"content":') >= 5


def test_expect_100_continue_is_answered_before_the_body_is_sent(proxy: Any) -> None:
    async def go() -> tuple[bytes, int, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(proxy))
        full = request_bytes(extra=b"expect: 100-continue\r\n")
        head, body = full.split(b"\r\n\r\n", 1)
        writer.write(head + b"\r\n\r\n")
        await writer.drain()
        async with asyncio.timeout(15):
            interim = await reader.readuntil(b"\r\n\r\n")
        writer.write(body)
        await writer.drain()
        status, _, answer = await read_answer(reader)
        writer.close()
        return interim, status, answer

    interim, status, answer = asyncio.run(go())
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert status == 200 and orjson.loads(answer)["choices"][0]["message"]["content"]
