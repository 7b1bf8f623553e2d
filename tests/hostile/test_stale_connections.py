"""An upstream closes a pooled keep-alive connection just as the proxy sends a request on it (its idle timeout fired
as the request crossed): the client must not see a 502 for it, with a single replica and so no failover. The
raw-socket upstream (tests/hostile/rawupstream.py) keeps each connection after its answer, waits for the next request
on it and drops that request, by close or by reset; the proxy sends it again (proxy/gateway/upstream.py). A connection
that breaks before it has served anything is a real failure, not sent again. Assertions are on outcomes: the client's
answer, the requests and connections the upstream saw."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import openai
import pytest

from tests.hostile import rawupstream as raw
from tests.hostile.test_hostile_upstreams import BODY, DONE, event

STREAM = [raw.sse_head(), event(b"hello"), event(b"", b'"stop"'), DONE, raw.LAST_CHUNK]


@pytest.fixture
def upstream() -> Iterator[raw.RawUpstream]:
    srv = raw.RawUpstream({
        "close": [raw.http(200, BODY), raw.CLOSE_ON_NEXT],
        "reset": [raw.http(200, BODY), raw.RESET_ON_NEXT],
        "s_close": [*STREAM, raw.CLOSE_ON_NEXT],
        "s_reset": [*STREAM, raw.RESET_ON_NEXT],
        "slow_close": [raw.Sleep(0.5), raw.http(200, BODY), raw.CLOSE_ON_NEXT],  # overlapping: one connection each
        "broken": [raw.CLOSE],
        "broken_reset": [raw.RESET],
    }).start()
    yield srv
    srv.stop()


def posts(upstream: raw.RawUpstream) -> tuple[int, int]:
    """(POST requests answered or dropped, connections that carried them): the proxy's readiness checks (marked
    x-dialect-proxy-check; answered and closed by the script for no case) have their own."""
    checks = sum(head.startswith(b"GET ") or b"x-dialect-proxy-check" in head for head in upstream.requests)
    return len(upstream.requests) - checks, upstream.connections - checks


def ask(client: openai.OpenAI, case: str, stream: bool) -> str:
    messages = [{"role": "user", "content": f"case:{case}"}]
    if not stream:
        return client.chat.completions.create(model="m", messages=messages).choices[0].message.content or ""
    return "".join(c.choices[0].delta.content or "" for c in
                   client.chat.completions.create(model="m", messages=messages, stream=True) if c.choices)


@pytest.mark.parametrize("case", ["close", "reset", "s_close", "s_reset"])
def test_a_request_on_a_pooled_connection_the_upstream_drops_is_sent_again(start_proxy, upstream, case):
    client = start_proxy([{"name": "one", "dialect": "openai", "url": upstream.url}]).client()
    stream = case.startswith("s_")
    assert ask(client, case, stream) == "hello"
    assert ask(client, case, stream) == "hello"  # on the kept connection, which the upstream drops: sent again
    assert ask(client, case, stream) == "hello"
    assert len(upstream.dropped) == 2  # the 2nd and 3rd requests each met a dropped connection first
    assert posts(upstream) == (3, 3)


def test_every_pooled_connection_dropped_in_turn_and_the_bound(start_proxy, upstream):
    """Five kept connections, all dropped by the upstream: a request tries pooled connections up to four times, so
    the first request after them fails (502, the upstream named), the next takes the last pooled one and then a new
    connection."""
    proxy = start_proxy([{"name": "one", "dialect": "openai", "url": upstream.url}])
    client = proxy.client()
    answers: list[str] = []
    threads = [threading.Thread(target=lambda: answers.append(ask(client, "slow_close", False))) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert answers == ["hello"] * 5 and posts(upstream) == (5, 5)
    with pytest.raises(openai.APIStatusError) as failed:
        ask(client, "slow_close", False)
    assert failed.value.status_code == 502 and "`one`" in failed.value.message
    assert len(upstream.dropped) == 4 and posts(upstream) == (5, 5)
    assert ask(client, "slow_close", False) == "hello"
    assert len(upstream.dropped) == 5 and posts(upstream) == (6, 6)


@pytest.mark.parametrize("case", ["broken", "broken_reset"])
def test_a_new_connection_that_breaks_is_not_sent_again(start_proxy, upstream, case):
    client = start_proxy([{"name": "one", "dialect": "openai", "url": upstream.url}]).client()
    with pytest.raises(openai.APIStatusError) as failed:
        ask(client, case, False)
    assert failed.value.status_code == 502
    assert posts(upstream) == (1, 1)
