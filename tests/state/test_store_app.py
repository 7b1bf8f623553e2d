"""The state store in the running proxy: /readyz reports it; an unreachable Redis is reported, never a 503 (requests
that need no state go on: chat completions keep working)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import Mock, RedisServer


def readyz(url: str) -> tuple[int, dict[str, Any]]:
    r = httpx.get(url + "/readyz", timeout=30)
    return r.status_code, r.json()


def test_readyz_reports_the_memory_store(start_mock: Callable[..., Mock], start_proxy: Callable[..., Any]) -> None:
    proxy = start_proxy(mock=start_mock("openai"))
    status, body = readyz(proxy.url)
    assert status == 200 and body["state_store"] == {"store": "memory", "reachable": True}


def test_readyz_reports_redis_and_stays_ready_without_it(
        start_mock: Callable[..., Mock], start_proxy: Callable[..., Any],
        start_redis: Callable[..., RedisServer]) -> None:
    password = "pw-not-for-logs"
    srv = start_redis("--requirepass", password)
    proxy = start_proxy(mock=start_mock("openai"), server={
        "state_store": f"redis://:{password}@127.0.0.1:{srv.port}/0", "state_timeout": 0.5})
    status, body = readyz(proxy.url)
    assert status == 200 and body["state_store"] == {"store": f"redis://***@127.0.0.1:{srv.port}/0",
                                                     "reachable": True}
    srv.kill()
    status, body = readyz(proxy.url)
    assert status == 200 and body["status"] == "ready"
    assert body["state_store"]["reachable"] is False
    assert body["state_store"]["detail"] == "The state store cannot be reached."
    assert password not in httpx.get(proxy.url + "/readyz", timeout=30).text
    # a request that needs no state is served as before
    answer = proxy.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content


def test_readyz_does_not_wait_for_a_silent_redis_longer_than_readiness_timeout(
        start_mock: Callable[..., Mock], start_proxy: Callable[..., Any]) -> None:
    """A Redis that accepts and never answers: /readyz reports it after readiness_timeout, not state_timeout x 2."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        proxy = start_proxy(mock=start_mock("openai"), server={
            "state_store": f"redis://127.0.0.1:{silent.getsockname()[1]}/0", "state_timeout": 30,
            "readiness_timeout": 0.3})
        status, body = readyz(proxy.url)
    assert status == 200 and body["state_store"]["reachable"] is False
    assert body["state_store"]["detail"] == "no answer within 0.3 s"


TOOL = {"type": "function", "name": "get_weather", "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def test_two_proxies_share_responses_through_redis(
        start_mock: Callable[..., Mock], start_proxy: Callable[..., Any], redis_url: str,
        redis_server: RedisServer) -> None:
    """A response stored by one replica is continued, retrieved and deleted through another (openai SDK)."""
    mock = start_mock("deepseek")
    a = start_proxy(mock=mock, server={"state_store": redis_url})
    b = start_proxy(mock=mock, server={"state_store": redis_url})
    first = a.client().responses.create(model="m", tools=[TOOL], input="Weather in Oslo? [mock:call_tool]")
    call = next(item for item in first.output if item.type == "function_call")
    assert redis_server.command("EXISTS", f"dialect-proxy:responses:{first.id}") == 1
    assert 86_000_000 < redis_server.command("PTTL", f"dialect-proxy:responses:{first.id}") <= 86_400_000
    second = b.client().responses.create(
        model="m", tools=[TOOL], previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert second.output_text == "Tool get_weather returned: sunny"
    assert b.client().responses.retrieve(first.id).id == first.id
    b.client().responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        a.client().responses.retrieve(first.id)


def test_redis_down_is_a_503_for_responses_and_chat_goes_on(
        start_mock: Callable[..., Mock], start_proxy: Callable[..., Any],
        start_redis: Callable[..., RedisServer]) -> None:
    srv = start_redis()
    proxy = start_proxy(mock=start_mock("openai"), server={"state_store": srv.url, "state_timeout": 0.5})
    client = proxy.client()
    first = client.responses.create(model="m", input="hi")
    srv.kill()
    with pytest.raises(openai.APIStatusError) as err:
        client.responses.create(model="m", input="again", previous_response_id=first.id)
    assert err.value.status_code == 503
    assert err.value.body["code"] == "state_store_unavailable"  # type: ignore[index]
    answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content
    srv.start()  # back, empty: the stored response is gone, which is a 400 naming the parameter
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model="m", input="again", previous_response_id=first.id)
    assert bad.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert "process's memory" not in bad.value.body["message"]  # type: ignore[index]  (a shared store: not the cause)
