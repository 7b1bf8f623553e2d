"""End to end: the retired DeepSeek names (`deepseek-chat`, `deepseek-reasoner`) follow the upstream's own model list
(docs/deepseek.md "Models"): an upstream that still serves them (the mock's `legacy` flavour: the seed document's
API, where `deepseek-reasoner` is R1 and V4 names do not exist) gets them unchanged, under that API's rules; one that
serves only V4 (the default mock, which refuses the retired names) gets their V4 successor; an upstream whose list
cannot be read gets today's mapping. The list is read once, not per request. Every client dialect."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import pytest

from tests.conftest import Mock, Proxy

RETIRED = ["deepseek-chat", "deepseek-reasoner"]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture
def anthropic_clients() -> Iterator[Callable[[Proxy], anthropic.Anthropic]]:
    clients: list[anthropic.Anthropic] = []

    def make(proxy: Proxy) -> anthropic.Anthropic:
        client = anthropic.Anthropic(base_url=proxy.url, api_key="sk-client-key", max_retries=0, timeout=30)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def ask(proxy: Proxy, messages_client: anthropic.Anthropic, client_dialect: str, model: str) -> str:
    """One question in the client dialect; the answer's text."""
    question = "Hello [mock:chunks=3]"
    if client_dialect == "chat":
        answer = proxy.client().chat.completions.create(model=model, messages=[{"role": "user", "content": question}])
        return answer.choices[0].message.content or ""
    if client_dialect == "responses":
        return proxy.client().responses.create(model=model, input=question).output_text
    message = messages_client.messages.create(model=model, max_tokens=100,
                                              messages=[{"role": "user", "content": question}])
    return "".join(block.text for block in message.content if block.type == "text")


@pytest.mark.parametrize("client_dialect", ["chat", "responses", "messages"])
@pytest.mark.parametrize("model", RETIRED)
def test_an_upstream_that_lists_the_retired_names_gets_them_unchanged(
        start_mock: Callable[..., Mock], start_proxy: Callable[..., Proxy], anthropic_clients: Any,
        client_dialect: str, model: str) -> None:
    mock = start_mock("deepseek", flavour="legacy")
    proxy = start_proxy(mock=mock)
    assert ask(proxy, anthropic_clients(proxy), client_dialect, model) == "tok0 tok1 tok2"
    body = mock.last_request()["body"]
    assert body["model"] == model
    assert "thinking" not in body and "reasoning_effort" not in body  # that API has no thinking switch


@pytest.mark.parametrize("client_dialect", ["chat", "responses", "messages"])
@pytest.mark.parametrize(("model", "thinking"), [("deepseek-chat", "disabled"), ("deepseek-reasoner", "enabled")])
def test_an_upstream_that_serves_only_v4_gets_the_successor(
        start_mock: Callable[..., Mock], start_proxy: Callable[..., Proxy], anthropic_clients: Any,
        client_dialect: str, model: str, thinking: str) -> None:
    mock = start_mock("deepseek")
    proxy = start_proxy(mock=mock)
    assert ask(proxy, anthropic_clients(proxy), client_dialect, model) == "tok0 tok1 tok2"
    body = mock.last_request()["body"]
    assert body["model"] == "deepseek-v4-flash" and body["thinking"] == {"type": thinking}


def test_the_legacy_reasoner_keeps_r1_rules(start_mock: Callable[..., Mock],
                                            start_proxy: Callable[..., Proxy]) -> None:
    """`deepseek-reasoner` served as is is R1: its reasoning comes back in `reasoning_content`, and a client that
    sends it back (even on tool-call turns, as thinking-mode docs ask), repeats a role or asks for a thinking level
    still gets an answer — R1 refuses reasoning as input and successive user messages, which the proxy strips and
    merges — never the V4 thinking-mode treatment."""
    mock = start_mock("deepseek", flavour="legacy")
    client = start_proxy(mock=mock).client()
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call], "reasoning_content": "I should look it up."},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "assistant", "content": "Sunny.", "reasoning_content": "It said sunny."},
        {"role": "user", "content": "Thanks."},
        {"role": "user", "content": "And tomorrow?"},
    ]
    answer = client.chat.completions.create(model="deepseek-reasoner", messages=history, tools=TOOLS,
                                            reasoning_effort="high")  # type: ignore[arg-type]
    message = answer.choices[0].message
    assert message.content and (message.model_extra or {}).get("reasoning_content")
    sent = mock.last_request()["body"]
    assert sent["model"] == "deepseek-reasoner"
    assert not any("reasoning_content" in m for m in sent["messages"])
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "tool", "assistant", "user"]
    with pytest.raises(Exception, match="logprobs"):  # R1 refuses them: the proxy's 400 names them
        client.chat.completions.create(model="deepseek-reasoner", messages=history[:1], logprobs=True)


def test_the_model_list_is_read_once(start_mock: Callable[..., Mock], start_proxy: Callable[..., Proxy]) -> None:
    mock = start_mock("deepseek", flavour="legacy")
    proxy = start_proxy(mock=mock, health_url=mock.url + "/health")  # the start-up check reads no list then

    async def burst() -> list[str]:
        client = proxy.async_client()
        try:
            answers = await asyncio.gather(*(client.chat.completions.create(
                model=RETIRED[i % 2], messages=[{"role": "user", "content": "hi [mock:chunks=2]"}]) for i in range(8)))
        finally:
            await client.close()
        return [a.choices[0].message.content or "" for a in answers]

    assert asyncio.run(burst()) == ["tok0 tok1"] * 8  # concurrent first requests share one read
    proxy.client().chat.completions.create(model="deepseek-chat", messages=[{"role": "user", "content": "hi"}])
    assert [m.id for m in proxy.client().models.list()] == RETIRED  # `/v1/models` uses the same cached list
    assert mock.stats()["model_lists"] == 1


def test_todays_names_never_wait_for_the_list(start_mock: Callable[..., Mock],
                                              start_proxy: Callable[..., Proxy]) -> None:
    mock = start_mock("deepseek")
    proxy = start_proxy(mock=mock, health_url=mock.url + "/health")
    for model in ("deepseek-flash", "deepseek-v4-pro"):
        proxy.client().chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    assert mock.stats()["model_lists"] == 0


def test_an_upstream_whose_list_cannot_be_read_gets_todays_mapping(start_mock: Callable[..., Mock],
                                                                   start_proxy: Callable[..., Proxy]) -> None:
    """Configured with DeepSeek's `/beta` base URL, the upstream answers chat but its model list is a 404 there: the
    retired names then map to V4 (today's API), and the failed read is not repeated per request."""
    mock = start_mock("deepseek")
    proxy = start_proxy([{"name": "ds", "dialect": "deepseek", "url": mock.url + "/beta"}])
    for _ in range(3):
        answer = proxy.client().chat.completions.create(model="deepseek-chat",
                                                        messages=[{"role": "user", "content": "hi [mock:chunks=2]"}])
        assert answer.choices[0].message.content == "tok0 tok1"
    last = mock.last_request()
    assert last["path"] == "/beta/chat/completions" and last["body"]["model"] == "deepseek-v4-flash"
