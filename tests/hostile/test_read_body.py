"""proxy/gateway/upstream.py read_body, on a raw loopback upstream: a body that came whole with the head (read at once,
no deadline armed) and one that trickles in (read as it comes, under the deadline) give the same bytes and the same
limits and failures."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import pytest

from proxy.errors import ProxyError, UpstreamTimeout
from proxy.gateway.upstream import read_body
from tests.hostile.rawupstream import CLOSE, RawUpstream, Sleep, http

BODY = b'{"answer": "' + b"x" * 3000 + b'"}'
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(BODY)
CASES = {
    "whole": [http(200, BODY)],  # head and body in one write
    "trickle": [HEAD, BODY[:1000], Sleep(0.2), BODY[1000:2000], Sleep(0.2), BODY[2000:]],
    "cut_whole": [HEAD + BODY[:100], CLOSE],
    "stall": [HEAD, BODY[:100], Sleep(3)],
}


@pytest.fixture(scope="module")
def upstream() -> Iterator[RawUpstream]:
    srv = RawUpstream(CASES).start()
    yield srv
    srv.stop()


def read(upstream: RawUpstream, case: str, limit: int = 2**20, timeout: float = 5.0) -> bytes:
    async def main() -> bytes:
        async with aiohttp.ClientSession() as session:
            async with session.post(upstream.url + "/x", data=f"case:{case}") as resp:
                if case == "whole":  # the body is in with the head: the read takes no await
                    await asyncio.sleep(0.2)
                    assert resp.content.is_eof()
                return await read_body(resp, timeout, limit, idle=1.0)

    return asyncio.run(main())


@pytest.mark.parametrize("case", ["whole", "trickle"])
def test_the_body_whole_or_trickled(upstream: RawUpstream, case: str) -> None:
    assert read(upstream, case) == BODY
    assert read(upstream, case, limit=len(BODY)) == BODY
    with pytest.raises(ProxyError, match="larger than the proxy accepts") as err:
        read(upstream, case, limit=len(BODY) - 1)
    assert err.value.status == 502


def test_a_body_cut_short_or_stalled(upstream: RawUpstream) -> None:
    with pytest.raises(ProxyError, match="middle of its answer") as err:
        read(upstream, "cut_whole")
    assert err.value.status == 502
    with pytest.raises(UpstreamTimeout, match="sent nothing for 1 s"):
        read(upstream, "stall")
