"""End to end: reasoning continuity beyond one proxy and one client dialect.

- The OpenAI Agents SDK (its default Responses model) runs two tool turns against the strict DeepSeek mock in
  thinking mode. It sends earlier reasoning items back without `encrypted_content` (it did not ask for it), so the
  proxy never takes them as reasoning; the continuity store puts the original back on every tool-call turn.
- Two proxies sharing one real redis-server: a turn served by one is restored by the other.
- A Redis restart (its data gone): the next turn falls back to DeepSeek's empty reasoning, never a 400.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import openai
from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled
from agents.models.openai_provider import OpenAIProvider

from proxy.mock.textgen import REASONING
from tests.conftest import Mock, Proxy, RedisServer
from tests.test_e2e_continuity import PLACEHOLDER, TOOLS, continuity_counts, sdk_agent, tool_turns

set_tracing_disabled(True)


def weather_agent(calls: list[str]) -> Agent[Any]:
    @function_tool
    def get_weather(city: str) -> str:
        """The weather of a city.

        Args:
            city: the city.
        """
        calls.append(city)
        return {"Paris": "sunny, 21 C", "Rome": "rain, 17 C"}.get(city, "cloudy")

    return Agent(name="Weather", instructions="Use the tool.", tools=[get_weather], model="deepseek-flash")


async def two_runs(proxy: Proxy, agent: Agent[Any]) -> list[str]:
    client = openai.AsyncOpenAI(base_url=proxy.base_url, api_key="sk-client-key", max_retries=0, timeout=30)
    config = RunConfig(model_provider=OpenAIProvider(openai_client=client), tracing_disabled=True)
    outputs = []
    try:
        items: list[Any] = []
        for question in ('Weather in Paris? [mock:call_tool=get_weather {"city": "Paris"}]',
                         'And in Rome? [mock:call_tool=get_weather {"city": "Rome"}]'):
            result = await Runner.run(agent, [*items, {"role": "user", "content": question}], run_config=config,
                                      max_turns=4)
            outputs.append(str(result.final_output))
            items = result.to_input_list()
    finally:
        await client.close()
    return outputs


def test_agents_sdk_two_tool_turns_through_the_proxy(start_mock: Callable[..., Mock],
                                                     start_proxy: Callable[..., Proxy]) -> None:
    mock = start_mock("deepseek")
    proxy = start_proxy(mock=mock)
    calls: list[str] = []
    outputs = asyncio.run(two_runs(proxy, weather_agent(calls)))
    assert calls == ["Paris", "Rome"]
    assert outputs == ["Tool get_weather returned: sunny, 21 C", "Tool get_weather returned: rain, 17 C"]
    last = mock.last_request()["body"]
    assert "thinking" not in last  # thinking mode (DeepSeek's default) stayed on
    assert [t["reasoning_content"] for t in tool_turns(last)] == [REASONING, REASONING]
    counts = continuity_counts(proxy)
    assert counts.get("fallback", 0) == 0 and counts["recorded"] == 2 and counts["restored"] >= 3


def test_two_proxies_share_reasoning_through_redis_and_a_restart_falls_back(
        start_mock: Callable[..., Mock], start_proxy: Callable[..., Proxy],
        start_redis: Callable[..., RedisServer]) -> None:
    redis = start_redis()
    mock = start_mock("deepseek")
    server = {"state_store": redis.url}
    first, second = start_proxy(mock=mock, server=server), start_proxy(mock=mock, server=server)
    history, received = sdk_agent(first.client(), "deepseek-flash", stream=True)
    assert received == [REASONING, REASONING]
    history.append({"role": "user", "content": "Thanks!"})
    second.client().chat.completions.create(model="deepseek-flash", messages=history, tools=TOOLS)  # type: ignore
    assert [t["reasoning_content"] for t in tool_turns(mock.last_request()["body"])] == [REASONING, REASONING]
    assert continuity_counts(second) == {"restored": 2}
    # Redis restarts without its data: the turns are unknown now; the placeholder, no 400
    redis.stop()
    redis.start()
    got = second.client().chat.completions.create(model="deepseek-flash", messages=history, tools=TOOLS)  # type: ignore
    assert got.choices[0].message.content
    assert [t["reasoning_content"] for t in tool_turns(mock.last_request()["body"])] == [PLACEHOLDER] * 2
    assert continuity_counts(second) == {"restored": 2, "fallback": 2}

