"""Hostile clients on loopback (issue 12, defects 4, 5 and 7): slowloris, header bombs, silent and trickling
connections, too many connections, an open redirect through Host, and x-request-id bytes. Every loop is bounded in
count and time; assertions are on outcomes (status, what the upstream saw), never on elapsed time."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
import orjson
import pytest

from proxy.server.app import create_app
from proxy.server.frontend import frontend_options
from proxy.settings import build_settings
from tests.conftest import ServerThread

CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'


def request_bytes(path: str = "/v1/chat/completions", body: bytes = CHAT, extra: bytes = b"") -> bytes:
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            + extra + b"content-length: %d\r\n\r\n" % len(body) + body)


async def read_answer(reader: asyncio.StreamReader, timeout: float = 15) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of one answer on a raw connection (the body up to content-length)."""
    async with asyncio.timeout(timeout):
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        if headers.get("transfer-encoding") == "chunked":
            parts = []
            for _ in range(100_000):  # bounded: a chunked body of at most that many chunks
                size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                data = await reader.readexactly(size + 2)
                if size == 0:
                    break
                parts.append(data[:-2])
            return status, headers, b"".join(parts)
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        return status, headers, body


async def closed(reader: asyncio.StreamReader, timeout: float = 15) -> bool:
    """True when the peer closed the connection (EOF) within `timeout`."""
    with contextlib.suppress(ConnectionError):
        async with asyncio.timeout(timeout):
            while await reader.read(65536):
                pass
    return True


def port_of(proxy) -> int:
    return int(proxy.url.rsplit(":", 1)[1])


@pytest.fixture
def proxy_for(start_mock, start_proxy):
    def start(**server):
        mock = start_mock("openai")
        return start_proxy(mock=mock, server=server), mock

    return start


# ------------------------------------------------------------------------------------------ header size (431)


def test_header_bomb_sent_slowly_is_refused_before_it_ends(proxy_for):
    proxy, _ = proxy_for(max_header_bytes=16384)

    async def bomb() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(proxy))
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-bomb: ")
        status = 0
        for _ in range(256):  # up to 1 MiB in 4 KiB pieces: never finishes the header
            try:
                writer.write(b"a" * 4096)
                await writer.drain()
            except ConnectionError:
                break
            if reader.at_eof() or len(reader._buffer):  # type: ignore[attr-defined]
                break
            await asyncio.sleep(0)
        status, headers, body = await read_answer(reader)
        assert headers["connection"] == "close"
        assert orjson.loads(body)["error"]["code"] == "request_header_fields_too_large"
        assert await closed(reader)
        writer.close()
        return status

    async def main() -> list[int]:
        return await asyncio.gather(*(bomb() for _ in range(20)))

    assert asyncio.run(main()) == [431] * 20
    assert proxy.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}]).choices


def test_header_bomb_in_one_write_is_refused(proxy_for):
    proxy, mock = proxy_for(max_header_bytes=8192)

    async def main() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(proxy))
        writer.write(request_bytes(extra=b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 100) for i in range(100))))
        status, _, _ = await read_answer(reader)
        writer.close()
        return status

    assert asyncio.run(main()) == 431
    assert mock.stats()["requests"] == 0


def test_headers_within_the_limit_are_served(proxy_for):
    proxy, _ = proxy_for(max_header_bytes=8192)
    resp = httpx.post(proxy.url + "/v1/chat/completions", content=CHAT, headers={"x-pad": "p" * 6000}, timeout=10)
    assert resp.status_code == 200


def test_answers_do_not_name_the_server_software(proxy_for):
    proxy, _ = proxy_for()
    for resp in (httpx.post(proxy.url + "/v1/chat/completions", content=CHAT, timeout=10),
                 httpx.get(proxy.url + "/healthz", timeout=10), httpx.get(proxy.url + "/metrics", timeout=10)):
        assert resp.status_code == 200
        assert "server" not in resp.headers
        assert resp.headers["date"]  # HTTP's Date stays


def test_the_date_header_follows_the_clock(proxy_for):
    """The server's Date line is made once per second (proxy/server/frontend.py _ServerLines), not frozen: answers a few
    seconds apart carry the current time."""
    from email.utils import parsedate_to_datetime

    proxy, _ = proxy_for()
    dates = []
    for _ in range(2):
        resp = httpx.post(proxy.url + "/v1/chat/completions", content=CHAT, timeout=10)
        assert resp.status_code == 200 and resp.json()["choices"]
        dates.append(parsedate_to_datetime(resp.headers["date"]))
        before = time.time()
        time.sleep(2.1)
    assert 2 <= (dates[1] - dates[0]).total_seconds() <= 4
    assert abs(dates[1].timestamp() - before) <= 2


# ------------------------------------------------------------------------------------ time to send (408)


def test_slowloris_connections_are_cut_and_never_starve_other_clients(proxy_for):
    proxy, _ = proxy_for(header_timeout=1.5)

    async def loris() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(proxy))
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        for i in range(100):  # one header byte every 0.2 s: would take 20 s to send 100 bytes
            if reader.at_eof() or len(reader._buffer):  # type: ignore[attr-defined]
                break
            try:
                writer.write(b"x-slow-%d: 1\r\n" % i)
                await writer.drain()
            except ConnectionError:
                break
            await asyncio.sleep(0.2)
        status, _, body = await read_answer(reader)
        assert orjson.loads(body)["error"]["code"] == "request_timeout"
        writer.close()
        return status

    async def normal(client: httpx.AsyncClient) -> int:
        resp = await client.post("/v1/chat/completions", content=CHAT, headers={"content-type": "application/json"})
        return resp.status_code

    async def main() -> tuple[list[int], list[int]]:
        lorises = [asyncio.create_task(loris()) for _ in range(150)]
        await asyncio.sleep(0.3)  # all of them are connected and trickling
        async with httpx.AsyncClient(base_url=proxy.url, timeout=20) as client:
            served = [await normal(client) for _ in range(10)]
            served += await asyncio.gather(*(normal(client) for _ in range(10)))
        return served, await asyncio.gather(*lorises)

    served, cut = asyncio.run(main())
    assert served == [200] * 20
    assert cut == [408] * 150


def test_a_connection_that_sends_nothing_is_closed(proxy_for):
    proxy, _ = proxy_for(header_timeout=0.5)

    async def main() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(proxy))
        status, _, _ = await read_answer(reader)
        assert await closed(reader)
        writer.close()
        return status

    assert asyncio.run(main()) == 408


def test_a_body_that_never_completes_is_cut(proxy_for):
    proxy, mock = proxy_for(body_timeout=0.5)

    async def main() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(proxy))
        full = request_bytes()
        writer.write(full[: len(full) - 10])  # the headers promise 10 bytes more than ever come
        status, _, body = await read_answer(reader)
        assert "body" in orjson.loads(body)["error"]["message"]
        assert await closed(reader)
        writer.close()
        return status

    assert asyncio.run(main()) == 408
    assert mock.stats()["requests"] == 0


def test_a_request_sent_in_pieces_within_the_limits_is_served(proxy_for):
    proxy, _ = proxy_for(header_timeout=5, body_timeout=5)

    async def main() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(proxy))
        data = request_bytes()
        for i in range(0, len(data), 16):
            writer.write(data[i:i + 16])
            await writer.drain()
            await asyncio.sleep(0.01)
        status, _, _ = await read_answer(reader)
        writer.close()
        return status

    assert asyncio.run(main()) == 200


def test_kept_alive_connections_serve_requests_until_idle_for_the_keep_alive_limit(start_mock, servers):
    """Kept-alive connections (uvicorn's timeout_keep_alive under the front end's own limits, proxy/server/frontend.py):
    each request ends the idle time before it (four requests 0.6 s apart outlive a 1 s limit), a connection then idle
    is closed without a word once the keep-alive limit is over (not the shorter header limit, which runs on the same
    timer), and a kept-alive connection whose next request stalls in its headers gets the header limit's 408."""
    mock = start_mock("openai")
    settings = build_settings(config={"upstreams": [{"name": "m", "dialect": "openai", "url": mock.url}],
                                      "server": {"header_timeout": 0.5}}, environ={})
    srv = ServerThread(create_app(settings), timeout_keep_alive=1.0, **frontend_options(settings.server)).start()
    servers.append(srv)

    async def main() -> tuple[list[int], bytes, float, int]:
        statuses = []
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        for _ in range(3):
            writer.write(request_bytes())
            statuses.append((await read_answer(reader))[0])
            await asyncio.sleep(0.6)
        writer.write(request_bytes())  # 1.8 s after the first answer: only an idle time of 0.6 s before it
        statuses.append((await read_answer(reader))[0])
        answered = time.monotonic()
        async with asyncio.timeout(15):
            said_at_close = await reader.read()  # up to EOF: an idle connection is closed without a word
        idle_for = time.monotonic() - answered
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(request_bytes())
        await read_answer(reader)
        writer.write(request_bytes()[:20])  # the next request's head never completes
        stalled, _, _ = await read_answer(reader)
        writer.close()
        return statuses, said_at_close, idle_for, stalled

    statuses, said_at_close, idle_for, stalled = asyncio.run(main())
    assert statuses == [200, 200, 200, 200]
    assert said_at_close == b""
    assert 0.9 <= idle_for < 10  # the keep-alive limit (1 s), not the header limit (0.5 s)
    assert stalled == 408


# ------------------------------------------------------------------------------------ connection cap (503)


def test_connections_over_the_cap_get_503_and_the_rest_are_served(proxy_for):
    proxy, _ = proxy_for(max_client_connections=8, header_timeout=30)

    async def main() -> tuple[list[int], int]:
        held = [await asyncio.open_connection("127.0.0.1", port_of(proxy)) for _ in range(8)]
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(proxy))
        status, headers, _ = await read_answer(reader)
        assert headers.get("retry-after") == "1"
        writer.close()
        served = []
        for r, w in held[:3]:  # the held connections still work
            w.write(request_bytes())
            served.append((await read_answer(r))[0])
        for _, w in held:
            w.close()
        return served, status

    served, refused = asyncio.run(main())
    assert refused == 503
    assert served == [200, 200, 200]
    # Once they are gone, new connections are accepted again (the count follows closes).
    for _ in range(50):
        try:
            if httpx.get(proxy.url + "/healthz", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
    assert httpx.post(proxy.url + "/v1/chat/completions", content=CHAT, timeout=10).status_code == 200


# ------------------------------------------------------------------------------------- open redirect (5)


@pytest.mark.parametrize("method,path", [("GET", "/v1/models/"), ("GET", "/healthz/"), ("GET", "/metrics/"),
                                         ("POST", "/v1/chat/completions/")])
def test_a_trailing_slash_never_redirects_to_the_clients_host(proxy_for, method, path):
    proxy, _ = proxy_for()
    resp = httpx.request(method, proxy.url + path, headers={"host": "evil.example"}, content=CHAT if
                         method == "POST" else None, timeout=10, follow_redirects=False)
    assert not 300 <= resp.status_code < 400
    assert "location" not in resp.headers
    assert resp.status_code in (200, 404)
    if method == "POST":
        assert resp.status_code == 200 and resp.json()["choices"]


# ------------------------------------------------------------------------------------- x-request-id (7)


@pytest.mark.parametrize("rid", ["请求-42-é", "plain-id", "🌍" * 60])
def test_request_id_reaches_the_upstream_and_the_client_byte_for_byte(proxy_for, rid):
    proxy, mock = proxy_for()
    sent = rid.encode()
    expected = sent[:200]
    if len(sent) > 200:  # cut at a character boundary
        expected = expected.decode("utf-8", "ignore").encode()

    async def main() -> dict[str, str]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(proxy))
        writer.write(request_bytes(extra=b"x-request-id: " + sent + b"\r\n"))
        status, headers, _ = await read_answer(reader)
        assert status == 200
        writer.close()
        return headers

    headers = asyncio.run(main())
    assert headers["x-request-id"].encode("latin-1") == expected
    upstream = mock.last_request()["headers"]["x-request-id"]
    assert upstream.encode("latin-1") == expected  # the mock's server decodes header bytes as latin-1


def test_a_request_id_that_is_not_utf8_is_returned_as_sent(proxy_for):
    proxy, mock = proxy_for()
    sent = b"caf\xe9-1"

    async def main() -> dict[str, str]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(proxy))
        writer.write(request_bytes(extra=b"x-request-id: " + sent + b"\r\n"))
        status, headers, _ = await read_answer(reader)
        assert status == 200
        writer.close()
        return headers

    assert asyncio.run(main())["x-request-id"].encode("latin-1") == sent
    upstream = mock.last_request()["headers"]["x-request-id"].encode("latin-1")
    assert upstream == "caf\ufffd-1".encode()  # U+FFFD for the byte that is no UTF-8 (docs/behaviour.md "Requests")
