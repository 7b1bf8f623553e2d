"""proxy/gateway/upstream.py `UpstreamClient.open`, on a raw loopback upstream: the wait for the answer's head ends
at its deadline with an UpstreamTimeout, and leaves the request's task as it found it (a retry on another replica,
or the error answer, must not be cancelled later by a timer of the failed attempt); a cancellation from elsewhere (the
client left) stays a cancellation; a head that comes in time is answered, with no timer left behind."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from proxy.errors import UpstreamTimeout
from proxy.gateway.upstream import UpstreamClient, read_body
from proxy.settings import ServerSettings, UpstreamSettings
from tests.hostile.rawupstream import RawUpstream, Sleep, http

BODY = b'{"answer": "yes"}'
CASES = {
    "silent": [Sleep(3)],  # accepts the request, sends nothing
    "late": [Sleep(0.3), http(200, BODY)],  # the head after 0.3 s
}


@pytest.fixture(scope="module")
def upstream() -> Iterator[RawUpstream]:
    srv = RawUpstream(CASES).start()
    yield srv
    srv.stop()


def client(upstream: RawUpstream, first_byte_timeout: float) -> UpstreamClient:
    return UpstreamClient(UpstreamSettings(name="raw", dialect="openai", url=upstream.url),
                          ServerSettings(first_byte_timeout=first_byte_timeout))


def test_a_silent_upstream_is_a_timeout_that_leaves_the_task_alone(upstream: RawUpstream) -> None:
    async def main() -> tuple[float, int]:
        c = client(upstream, 0.3)
        started = time.monotonic()
        try:
            with pytest.raises(UpstreamTimeout, match=r"`raw` sent no response within 0\.3 s"):
                await c.open("POST", upstream.url + "/x", body=b"case:silent")
            waited = time.monotonic() - started
            task = asyncio.current_task()
            assert task is not None
            await asyncio.sleep(0.5)  # past where a timer left behind would fire: the task goes on
            return waited, task.cancelling()
        finally:
            await c.close()

    waited, cancelling = asyncio.run(main())
    assert 0.25 < waited < 2.0
    assert cancelling == 0


def test_a_head_in_time_is_answered_and_no_timer_outlives_it(upstream: RawUpstream) -> None:
    async def main() -> bytes:
        c = client(upstream, 1.0)
        try:
            resp = await c.open("POST", upstream.url + "/x", body=b"case:late")
            assert resp.status == 200
            await asyncio.sleep(1.2)  # past the head's deadline: the task is not cancelled
            return await read_body(resp, 5.0)
        finally:
            await c.close()

    assert asyncio.run(main()) == BODY


def test_a_cancellation_from_elsewhere_stays_one(upstream: RawUpstream) -> None:
    async def main() -> None:
        c = client(upstream, 0.3)
        try:
            waiting = asyncio.ensure_future(c.open("POST", upstream.url + "/x", body=b"case:silent"))
            await asyncio.sleep(0.1)
            waiting.cancel()  # as the disconnect watch does when the client leaves
            with pytest.raises(asyncio.CancelledError):
                await waiting
            await asyncio.sleep(0.4)  # the head's deadline passes: nothing else is cancelled
        finally:
            await c.close()

    asyncio.run(main())
