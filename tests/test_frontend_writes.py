"""The front end writes a response's head together with its first body bytes (proxy/server/frontend.py `Cycle`): one
write for a non-stream answer instead of two. What must not change: HEAD answers (no body bytes), `100 Continue`
(sent before the client sends its body), keep-alive and pipelined requests, streams, and uvicorn's checks of what
the app sends."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import httpx
import orjson
import pytest

from proxy.server.frontend import Cycle, FrontendLimits, GuardedHttpToolsProtocol
from tests.hostile.rawupstream import CLOSE, LAST_CHUNK, RawUpstream, chunk, sse_head
from tests.hostile.test_hostile_clients import port_of, read_answer, request_bytes


class Recorder(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def writelines(self, parts: Any) -> None:  # one write call of several pieces (uvloop: one writev), kept apart
        self.writes.append(tuple(bytes(part) for part in parts))  # type: ignore[arg-type]

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def connection() -> tuple[GuardedHttpToolsProtocol, Recorder]:
    """A connection protocol on a recording transport, with uvicorn's server state as the server gives it."""
    config = SimpleNamespace(loaded=True, loaded_app=None, root_path="", asgi_version="3.0", timeout_keep_alive=5)
    state = SimpleNamespace(connections=set(), tasks=set(), default_headers=[], total_requests=0)
    conn = GuardedHttpToolsProtocol(config, state, {}, asyncio.new_event_loop(), limits=FrontendLimits())
    out = Recorder()
    conn.connection_made(out)
    return conn, out


def answer(cycle: Cycle, *messages: dict[str, Any]) -> None:
    async def go() -> None:
        for message in messages:
            await cycle.send(message)
    asyncio.run(go())


START = {"type": "http.response.start", "status": 200, "headers": [(b"Content-Length", b"6")]}
HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\n"


def test_head_goes_out_with_the_first_body_bytes_then_writes_pass() -> None:
    conn, out = connection()
    cycle = Cycle(conn, {}, False, False, True)
    answer(cycle, START)
    assert out.writes == []
    answer(cycle, {"type": "http.response.body", "body": b"ok", "more_body": True},
           {"type": "http.response.body", "body": b"more"})
    assert out.writes == [HEAD + b"ok", b"more"] and cycle.response_complete and not out.closed
    assert conn.server_state.total_requests == 1  # the connection was told: the next request may start
    conn.loop.close()


def test_a_head_without_body_goes_out_when_the_response_completes_or_the_connection_closes() -> None:
    conn, out = connection()
    head_only = Cycle(conn, {}, True, False, True)  # a HEAD request
    answer(head_only, START, {"type": "http.response.body", "body": b""})
    assert out.writes == [HEAD] and head_only.response_complete
    failing = Cycle(conn, {}, False, False, True)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(START)
        raise RuntimeError("the app fails after the head")

    asyncio.run(failing.run_asgi(app))
    assert out.writes == [HEAD, HEAD] and out.closed  # the head, then the connection closed: a cut answer
    conn.loop.close()


def test_100_continue_is_never_held() -> None:
    conn, out = connection()
    cycle = Cycle(conn, {}, False, True, True)  # the request said `expect: 100-continue`
    cycle.more_body = False
    cycle.wake()

    async def go() -> dict[str, Any]:
        message = await cycle.receive()
        await cycle.send(START)
        await cycle.send({"type": "http.response.body", "body": memoryview(b"ok all")})
        return message

    assert asyncio.run(go())["type"] == "http.request"
    assert out.writes == [b"HTTP/1.1 100 Continue\r\n\r\n", HEAD + b"ok all"]
    conn.loop.close()


@pytest.mark.parametrize("headers, error", [
    ([(b"x-id", b"a\r\nset-cookie: x")], "Invalid HTTP header value."),
    ([(b"bad name", b"v")], "Invalid HTTP header name."),
])
def test_headers_that_would_split_the_answer_are_refused(headers: list[tuple[bytes, bytes]], error: str) -> None:
    conn, out = connection()
    cycle = Cycle(conn, {}, False, False, True)
    with pytest.raises(RuntimeError, match=error):
        answer(cycle, {"type": "http.response.start", "status": 200, "headers": headers})
    assert out.writes == []
    conn.loop.close()


def test_every_control_character_but_tab_is_refused_in_a_header_value() -> None:
    """The check is a translate that leaves a good value the same object (proxy/server/frontend.py `_VALUE_OK`),
    confirmed by the RFC 9110 rule's search: the two agree on every byte, and a bad one is refused wherever it is."""
    for byte in range(256):
        conn, out = connection()
        value = b"id-" + bytes([byte]) + b"-1"
        bad = byte < 32 and byte != 9 or byte == 127
        cycle = Cycle(conn, {}, False, False, True)
        start = {"type": "http.response.start", "status": 200, "headers": [(b"x-request-id", value)]}
        if bad:
            with pytest.raises(RuntimeError, match="Invalid HTTP header value."):
                answer(cycle, start)
        else:
            answer(cycle, start, {"type": "http.response.body", "body": b""})
            assert value in out.writes[0]
        conn.loop.close()


def test_a_header_name_is_a_token_of_rfc_9110() -> None:
    """tchar: ALPHA, DIGIT and !#$%&'*+-.^_`|~ — no delimiter ("(),/:;<=>?@[\\]{}), space, control or byte above
    0x7f, and not empty."""
    tchar = set(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    for name in [b"", *(b"x" + bytes([byte]) for byte in range(256))]:
        conn, out = connection()
        cycle = Cycle(conn, {}, False, False, True)
        start = {"type": "http.response.start", "status": 200, "headers": [(name, b"v")]}
        if name and name[1] in tchar:
            answer(cycle, start, {"type": "http.response.body", "body": b""})
            assert name.lower() + b": v\r\n" in out.writes[0]
        else:
            with pytest.raises(RuntimeError, match="Invalid HTTP header name."):
                answer(cycle, start)
        conn.loop.close()


@pytest.mark.parametrize("status, line", [(200, b"HTTP/1.1 200 OK\r\n"), (418, b"HTTP/1.1 418 I'm a Teapot\r\n"),
                                          (431, b"HTTP/1.1 431 Request Header Fields Too Large\r\n"),
                                          (599, b"HTTP/1.1 599 \r\n")])
def test_the_status_line_has_the_reason_phrase_when_there_is_one(status: int, line: bytes) -> None:
    conn, out = connection()
    answer(Cycle(conn, {}, False, False, True), {"type": "http.response.start", "status": status, "headers": []},
           {"type": "http.response.body", "body": b""})
    assert out.writes[0].startswith(line)
    conn.loop.close()


@pytest.mark.parametrize("sockname, peername, server, client", [
    (("127.0.0.1", 8000), ("127.0.0.1", 50000), ("127.0.0.1", 8000), ("127.0.0.1", 50000)),
    (("::1", 8000, 0, 0), ("::1", 50000, 0, 0), ("::1", 8000), ("::1", 50000)),  # IPv6: flow info, scope id dropped
    ("/run/proxy.sock", "", ("/run/proxy.sock", None), None),  # a Unix socket: no client address
    (None, None, None, None),
])
def test_the_scope_has_the_addresses_the_transport_gives(sockname: Any, peername: Any, server: Any,
                                                         client: Any) -> None:
    config = SimpleNamespace(loaded=True, loaded_app=None, root_path="", asgi_version="3.0", timeout_keep_alive=5)
    state = SimpleNamespace(connections=set(), tasks=set(), default_headers=[], total_requests=0)
    conn = GuardedHttpToolsProtocol(config, state, {}, asyncio.new_event_loop(), limits=FrontendLimits())
    out = Recorder()
    info = {"sockname": sockname, "peername": peername}
    out.get_extra_info = lambda name, default=None: info.get(name, default)  # type: ignore[method-assign]
    conn.connection_made(out)
    assert (conn.server, conn.client, conn.scheme) == (server, client, "http")
    conn.connection_lost(None)
    conn.loop.close()


def test_headers_and_bodies_may_be_any_bytes_like_objects_in_lists() -> None:
    """ASGI allows header pairs as any iterable of two bytes-like objects, and bodies as bytes-like: as uvicorn."""
    conn, out = connection()
    cycle = Cycle(conn, {}, False, False, True)
    answer(cycle, {"type": "http.response.start", "status": 200,
                   "headers": [[bytearray(b"X-A"), memoryview(b"1")], (b"content-length", b"4")]},
           {"type": "http.response.body", "body": bytearray(b"ab"), "more_body": True},
           {"type": "http.response.body", "body": memoryview(b"cd")})
    assert out.writes == [b"HTTP/1.1 200 OK\r\nx-a: 1\r\ncontent-length: 4\r\n\r\nab", b"cd"]
    conn.loop.close()


def test_a_body_longer_or_shorter_than_its_content_length_is_an_error() -> None:
    conn, _ = connection()
    with pytest.raises(RuntimeError, match="longer than Content-Length"):
        answer(Cycle(conn, {}, False, False, True), START, {"type": "http.response.body", "body": b"1234567"})
    with pytest.raises(RuntimeError, match="shorter than Content-Length"):
        answer(Cycle(conn, {}, False, False, True), START, {"type": "http.response.body", "body": b"12345"})
    conn.loop.close()


def test_without_a_length_the_answer_is_chunked_and_ends_with_the_last_chunk() -> None:
    conn, out = connection()
    cycle = Cycle(conn, {}, False, False, False)  # the client asked to close after this answer
    answer(cycle, {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]},
           {"type": "http.response.body", "body": b"ab", "more_body": True},
           {"type": "http.response.body", "body": b"c"})
    assert out.writes == [b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n"
                          b"transfer-encoding: chunked\r\n\r\n2\r\nab\r\n", b"1\r\nc\r\n0\r\n\r\n"]
    assert out.closed
    conn.loop.close()


def test_a_big_chunk_goes_out_as_its_pieces_in_one_call_a_small_one_framed_in_one_buffer() -> None:
    """A chunk of 4 KiB or more (a fast stream's read of many events) is written with its framing as separate pieces,
    the body not copied; the bytes on the wire are the same as the framed copy's, the held head first."""
    conn, out = connection()
    big, more = b"x" * 5000, b"y" * 4096
    cycle = Cycle(conn, {}, False, False, True)
    answer(cycle, {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]},
           {"type": "http.response.body", "body": big, "more_body": True},
           {"type": "http.response.body", "body": b"ab", "more_body": True},
           {"type": "http.response.body", "body": more})
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n"
    assert out.writes == [(head, b"1388\r\n", big, b"\r\n"), b"2\r\nab\r\n",
                          (b"1000\r\n", more, b"\r\n0\r\n\r\n")]
    conn.loop.close()


def test_a_read_of_many_events_reaches_a_real_client_whole(start_proxy: Any) -> None:
    """An upstream that writes its whole stream at once: the proxy reads many events together and sends their
    translation as one big chunk (written as pieces, above); the client's HTTP parser gets every event, in order."""
    tokens = [f"tok{i:03d} " for i in range(200)]
    events = b"".join(b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":null}]}\n\n'
                      % t.encode() for t in tokens)
    events += b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    upstream = RawUpstream({"burst": [sse_head() + chunk(events) + LAST_CHUNK, CLOSE]}).start()
    try:
        proxy = start_proxy([{"name": "burst", "dialect": "openai", "url": upstream.url}])
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "case:burst"}]}
        with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body, timeout=20) as r:
            assert r.status_code == 200
            raw = r.read()
    finally:
        upstream.stop()
    assert len(raw) > 4096
    lines = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]
    assert lines[-1] == b"[DONE]"
    chunks = [orjson.loads(line) for line in lines[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "".join(tokens)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.fixture
def proxy(start_mock: Any, start_proxy: Any) -> Any:
    # (full_text as the mock streams: without it the stream would end in a full_text_mismatch error)
    return start_proxy(mock=start_mock("mindie", full_text=True), aliases={"m": "mock-model"}, full_text=True)


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
