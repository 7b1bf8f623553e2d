"""Per-key limits in one proxy (the in-memory counters): the policy of api_keys_file, the answers the openai and
anthropic SDKs read (429 + Retry-After and the rate-limit headers, insufficient_quota not retried, the permission
error naming the model), the file read again without a restart, and fairness across keys in a contended queue.
Across processes with Redis: tests/state/test_limits_shared.py."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from proxy.gateway.keys import read_key_file
from proxy.settings import ConfigError
from tests.conftest import Mock, Proxy, wait_for

CHAT = {"model": "DeepSeek-R1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}


def key_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "keys.yaml"
    path.write_text(text)
    return str(path)


def limited_proxy(start_mock: Callable[..., Mock], start_proxy: Callable[..., Proxy], keys: str,
                  **server: Any) -> tuple[Mock, Proxy]:
    mock = start_mock("mindie")
    proxy = start_proxy(mock=mock, server={"api_keys_file": keys, **server})
    return mock, proxy


def metric(proxy: Proxy, line_start: str) -> float:
    for line in httpx.get(proxy.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_the_policy_file_is_read_into_typed_records(tmp_path: Path) -> None:
    path = key_file(tmp_path, """
default:
  requests_per_minute: 30
team-a:
  key: sk-a
  models: ["DeepSeek-R1", "bge-*"]
  tokens_per_minute: 200000
  max_concurrent: 8
  tokens_per_day: 5000000
  tokens_per_month: 100000000
  expires: 2027-01-31
  weight: 2
team-b: sk-b
team-c:
  key_sha256: 2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b
""")
    ring = read_key_file(path)
    by_name = {p.name: p for p in ring.policies.values()}
    a, b, c = by_name["team-a"], by_name["team-b"], by_name["team-c"]
    assert a.models == ("DeepSeek-R1", "bge-*") and a.allows("bge-m3") and not a.allows("gpt-4")
    assert (a.requests_per_minute, a.tokens_per_minute, a.max_concurrent) == (30, 200000, 8)  # rpm from default
    assert (a.tokens_per_day, a.tokens_per_month, a.weight, str(a.expires)) == (5000000, 100000000, 2.0, "2027-01-31")
    assert b.requests_per_minute == 30 and b.models is None and b.limited
    assert c.requests_per_minute == 30  # known by its hash alone (sha256 of "secret")
    with pytest.raises(ConfigError, match=r"team-x.tokens_per_minute: expected a whole number"):
        read_key_file(key_file(tmp_path, "team-x:\n  key: k\n  tokens_per_minute: lots\n"))
    with pytest.raises(ConfigError, match="team-x: unknown field 'rpm'"):
        read_key_file(key_file(tmp_path, "team-x:\n  key: k\n  rpm: 3\n"))


def test_requests_per_minute_is_exact_and_every_answer_says_so(start_mock: Callable[..., Mock],
                                                                 start_proxy: Callable[..., Proxy],
                                                                 tmp_path: Path) -> None:
    _, proxy = limited_proxy(start_mock, start_proxy, key_file(tmp_path, """
team-a:
  key: sk-a
  requests_per_minute: 5
  tokens_per_minute: 100000
"""))
    answers = [httpx.post(proxy.base_url + "/chat/completions", headers={"Authorization": "Bearer sk-a"}, json=CHAT,
                          timeout=10) for _ in range(7)]
    assert [a.status_code for a in answers] == [200] * 5 + [429] * 2
    assert [a.headers["x-ratelimit-remaining-requests"] for a in answers[:5]] == ["4", "3", "2", "1", "0"]
    refused = answers[5]
    assert refused.headers["x-ratelimit-limit-requests"] == "5"
    assert refused.headers["x-ratelimit-limit-tokens"] == "100000"
    assert 55 <= int(refused.headers["retry-after"]) <= 60
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert "x-should-retry" not in refused.headers
    assert metric(proxy, 'dialect_proxy_limited_total{key="team-a",reason="requests"}') == 2


def test_the_sdks_wait_as_told_and_recover(start_mock: Callable[..., Mock], start_proxy: Callable[..., Proxy],
                                           tmp_path: Path) -> None:
    """A 2-second window: the third request of each SDK is refused with Retry-After, which the SDK waits, then
    gets its answer; no change on the client's side."""
    mock, proxy = limited_proxy(start_mock, start_proxy, key_file(tmp_path, """
team-a:
  key: sk-a
  requests_per_minute: 2
"""), limits_window=2)
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-a", max_retries=3, timeout=30)
    started = time.monotonic()
    for _ in range(3):
        assert client.chat.completions.create(**CHAT).choices[0].message.content
    assert time.monotonic() - started >= 1.0  # waited for the window
    client.close()
    anth = anthropic.Anthropic(base_url=proxy.url, api_key="sk-a", max_retries=3, timeout=30)
    for _ in range(3):
        reply = anth.messages.create(model="DeepSeek-R1", max_tokens=20, messages=[{"role": "user", "content": "hi"}])
        assert reply.content
    raw = anth.messages.with_raw_response.create(model="DeepSeek-R1", max_tokens=20,
                                                  messages=[{"role": "user", "content": "hi"}])
    assert raw.headers["anthropic-ratelimit-requests-limit"] == "2"
    assert raw.headers["anthropic-ratelimit-requests-reset"].endswith("Z")
    anth.close()
    assert metric(proxy, 'dialect_proxy_limited_total{key="team-a",reason="requests"}') >= 2
    assert mock.stats()["requests"] == 7


def test_a_used_up_quota_is_insufficient_quota_and_not_retried(start_mock: Callable[..., Mock],
                                                                 start_proxy: Callable[..., Proxy],
                                                                 tmp_path: Path) -> None:
    mock, proxy = limited_proxy(start_mock, start_proxy, key_file(tmp_path, """
team-q:
  key: sk-q
  tokens_per_day: 200
"""))
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-q", max_retries=3, timeout=30)
    client.chat.completions.create(**{**CHAT, "max_tokens": 100})  # reserves ~110, uses ~20: the rest is given back
    with pytest.raises(openai.RateLimitError) as caught:
        while mock.stats()["requests"] < 20:  # bounded: the quota runs out long before
            client.chat.completions.create(**{**CHAT, "max_tokens": 100})
    assert caught.value.code == "insufficient_quota"
    assert caught.value.response.headers["x-should-retry"] == "false"
    client.close()
    refused = metric(proxy, 'dialect_proxy_limited_total{key="team-q",reason="day"}')
    assert refused == 1  # the SDK did not send it again
    anth = anthropic.Anthropic(base_url=proxy.url, api_key="sk-q", max_retries=3, timeout=30)
    with pytest.raises(anthropic.RateLimitError):
        anth.messages.create(model="DeepSeek-R1", max_tokens=100, messages=[{"role": "user", "content": "hi"}])
    anth.close()
    assert metric(proxy, 'dialect_proxy_limited_total{key="team-q",reason="day"}') == refused + 1
    assert 0 <= metric(proxy, 'dialect_proxy_quota_remaining_tokens{key="team-q",period="day"}') < 200


def test_a_model_the_key_may_not_use_is_a_permission_error_naming_it(start_mock: Callable[..., Mock],
                                                                      start_proxy: Callable[..., Proxy],
                                                                      tmp_path: Path) -> None:
    _, proxy = limited_proxy(start_mock, start_proxy, key_file(tmp_path, """
team-a:
  key: sk-a
  models: ["DeepSeek-*"]
"""))
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-a", max_retries=0)
    with pytest.raises(openai.PermissionDeniedError, match="'qwen-72b'"):
        client.chat.completions.create(**{**CHAT, "model": "qwen-72b"})
    assert client.chat.completions.create(**CHAT).choices
    client.close()
    anth = anthropic.Anthropic(base_url=proxy.url, api_key="sk-a", max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError, match="'qwen-72b'"):
        anth.messages.create(model="qwen-72b", max_tokens=20, messages=[{"role": "user", "content": "hi"}])
    anth.close()


def test_the_file_is_read_again_without_a_restart(start_mock: Callable[..., Mock], start_proxy: Callable[..., Proxy],
                                                  tmp_path: Path) -> None:
    path = key_file(tmp_path, "team-a: sk-a\nteam-b: sk-b\n")
    _, proxy = limited_proxy(start_mock, start_proxy, path)

    def status(key: str) -> int:
        return httpx.post(proxy.base_url + "/chat/completions", headers={"Authorization": f"Bearer {key}"},
                          json=CHAT, timeout=10).status_code

    assert (status("sk-a"), status("sk-b")) == (200, 200)
    Path(path).write_text("team-a: sk-a\nteam-b:\n  key: sk-b\n  expires: 2020-01-01\nteam-c: sk-c\n")
    os.utime(path, (time.time() + 5, time.time() + 5))  # a new modification time, whatever the clock's grain
    assert wait_for(lambda: status("sk-b") == 401, timeout=3)  # expired: refused within the poll's second
    assert (status("sk-a"), status("sk-c")) == (200, 200)
    Path(path).write_text("team-a: [unclosed\n")  # a half-saved edit: the keys read before stay
    os.utime(path, (time.time() + 10, time.time() + 10))
    time.sleep(1.5)
    assert status("sk-a") == 200


def test_a_flooding_key_delays_only_itself(start_mock: Callable[..., Mock], start_proxy: Callable[..., Proxy],
                                           tmp_path: Path) -> None:
    """Two slots, a key with 32 callers and a key with one (both weight 1): the one's queue wait stays within a few
    request durations, where first come, first served would make it wait for ~16 (measured: ~1 and ~15)."""
    mock = start_mock("mindie")
    keys = key_file(tmp_path, "flood:\n  key: sk-f\ninteractive:\n  key: sk-i\n")
    proxy = start_proxy(mock=mock, server={"api_keys_file": keys}, max_in_flight=2, queue_size=64,
                        queue_timeout=60)
    slow = {**CHAT, "messages": [{"role": "user", "content": "[mock:chunks=4,delay_ms=25] hi"}], "stream": True}
    waits: list[float] = []

    async def one(client: httpx.AsyncClient, key: str) -> float:
        started = time.monotonic()
        async with client.stream("POST", proxy.base_url + "/chat/completions", json=slow,
                                 headers={"Authorization": f"Bearer {key}"}) as resp:
            assert resp.status_code == 200
            async for _ in resp.aiter_bytes():
                pass
        return time.monotonic() - started

    async def main() -> None:
        stop = time.monotonic() + 10
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=64)) as client:
            alone = statistics.median([await one(client, "sk-i") for _ in range(5)])

            async def flood() -> None:
                while time.monotonic() < stop:
                    await one(client, "sk-f")

            async def interactive() -> None:
                await asyncio.sleep(1)  # the flood's queue is full by now
                while time.monotonic() < stop:
                    waits.append(await one(client, "sk-i") - alone)

            await asyncio.wait_for(asyncio.gather(*(flood() for _ in range(32)), interactive()), 60)
        waits.sort()
        p95 = waits[int(0.95 * (len(waits) - 1))]
        assert len(waits) >= 4, (alone, waits)
        assert p95 < 4 * alone, (p95, alone, waits)

    asyncio.run(main())


def test_every_api_tells_a_limited_key_its_limits(start_mock: Callable[..., Mock], start_proxy: Callable[..., Proxy],
                                                  tmp_path: Path) -> None:
    _, proxy = limited_proxy(start_mock, start_proxy, key_file(tmp_path, """
team-a:
  key: sk-a
  requests_per_minute: 100
  tokens_per_minute: 100000
"""))
    auth = {"Authorization": "Bearer sk-a"}
    calls = [("/v1/chat/completions", CHAT), ("/v1/completions", {"model": "DeepSeek-R1", "prompt": "hi",
                                                                  "max_tokens": 5}),
             ("/v1/responses", {"model": "DeepSeek-R1", "input": "hi", "max_output_tokens": 16}),
             ("/v1/chat/completions", {**CHAT, "stream": True})]
    for i, (path, body) in enumerate(calls):
        answer = httpx.post(proxy.url + path, headers=auth, json=body, timeout=10)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-ratelimit-remaining-requests"] == str(99 - i), path
        assert int(answer.headers["x-ratelimit-remaining-tokens"]) < 100000
    messages = httpx.post(proxy.url + "/v1/messages", headers={"x-api-key": "sk-a"}, timeout=10, json={
        "model": "DeepSeek-R1", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})
    assert messages.headers["anthropic-ratelimit-requests-remaining"] == "95"
    assert messages.headers["anthropic-ratelimit-tokens-limit"] == "100000"
    assert "x-ratelimit-limit-requests" not in messages.headers
