"""End to end: the OpenAI Agents SDK with its default (Responses) model -> proxy `/v1/responses` -> built-in mock.

An agent with one function tool; the prompt carries `[mock:call_tool...]`, so the mock (whatever its dialect) first
answers with a call to that tool, the SDK runs it and sends its output back as `function_call_output`, and the mock's
second answer quotes the output: the final output proves the tool ran with the arguments the upstream chose.
The SDK's client is an `AsyncOpenAI` whose base_url is the proxy, given through `RunConfig(model_provider=
OpenAIProvider(openai_client=...))` (no global state); tracing is off.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import openai
import pytest
from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled
from agents.models.openai_provider import OpenAIProvider

from tests.conftest import Mock, Proxy

set_tracing_disabled(True)

# every mock dialect that supports tools ("+full_text": MindIE/Siliconstorm fullTextEnabled)
DIALECTS = ["openai", "mindie", "mindie+full_text", "siliconstorm", "deepseek", "engine"]


def make_agent(calls: list[dict[str, Any]]) -> Agent[Any]:
    @function_tool
    def save_note(title: str, body: str) -> str:
        """Save a note.

        Args:
            title: a short title.
            body: the note's text.
        """
        calls.append({"title": title, "body": body})
        return f"saved note {title!r} ({len(body)} characters)"

    return Agent(name="Notes", instructions="Use the tool to save notes.", tools=[save_note])


async def run(proxy: Proxy, agent: Agent[Any], prompt: str, streamed: bool) -> tuple[str, list[str]]:
    """(final output, the stream event types seen) of one run through the proxy."""
    client = openai.AsyncOpenAI(base_url=proxy.base_url, api_key="sk-client-key", max_retries=0, timeout=30)
    config = RunConfig(model_provider=OpenAIProvider(openai_client=client), tracing_disabled=True)
    try:
        if not streamed:
            result = await Runner.run(agent, prompt, run_config=config, max_turns=4)
            return str(result.final_output), []
        streaming = Runner.run_streamed(agent, prompt, run_config=config, max_turns=4)
        seen = [event.type async for event in streaming.stream_events()]
        return str(streaming.final_output), seen
    finally:
        await client.close()


def start(start_mock: Callable[..., Mock], start_proxy: Callable[..., Proxy], dialect: str) -> tuple[Mock, Proxy]:
    name, _, mode = dialect.partition("+")
    mock = start_mock(name, full_text=bool(mode))
    return mock, start_proxy(mock=mock, **({"full_text": True} if mode else {}))


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_agent_runs_its_function_tool_through_the_proxy(start_mock: Callable[..., Mock],
                                                        start_proxy: Callable[..., Proxy], dialect: str,
                                                        streamed: bool) -> None:
    mock, proxy = start(start_mock, start_proxy, dialect)
    calls: list[dict[str, Any]] = []
    title = f"note-{uuid.uuid4().hex[:10]}"
    prompt = f'Save this note. [mock:call_tool=save_note {{"title": "{title}", "body": "buy milk, eggs"}}]'
    final, seen = asyncio.run(run(proxy, make_agent(calls), prompt, streamed))
    assert calls == [{"title": title, "body": "buy milk, eggs"}]
    assert final == f"Tool save_note returned: saved note '{title}' (14 characters)"
    if streamed:
        assert "raw_response_event" in seen and "run_item_stream_event" in seen
    stats = mock.stats()
    assert stats["requests"] == 2 and stats["completed"] == 2, stats
    # the second upstream request carried the call and its output back as chat messages
    messages = mock.last_request()["body"]["messages"]
    assert messages[-1]["role"] == "tool" and title in str(messages[-1]["content"])


@pytest.mark.parametrize("dialect", ["openai", "mindie"])
def test_agent_tool_arguments_made_up_by_the_upstream(start_mock: Callable[..., Mock],
                                                      start_proxy: Callable[..., Proxy], dialect: str) -> None:
    """No arguments in the directive: the mock fills the tool's strict schema itself (both properties required)."""
    _, proxy = start(start_mock, start_proxy, dialect)
    calls: list[dict[str, Any]] = []
    final, _ = asyncio.run(run(proxy, make_agent(calls), "Save a note. [mock:call_tool]", streamed=True))
    assert calls == [{"title": "mock", "body": "mock"}]
    assert final == "Tool save_note returned: saved note 'mock' (4 characters)"


def test_agent_without_a_directive_gets_a_plain_answer(start_mock: Callable[..., Mock],
                                                       start_proxy: Callable[..., Proxy]) -> None:
    _, proxy = start(start_mock, start_proxy, "mindie")
    calls: list[dict[str, Any]] = []
    final, _ = asyncio.run(run(proxy, make_agent(calls), "Hello!", streamed=False))
    assert calls == [] and final == "Hello from the mock mindie upstream! 你好, 世界 🌍."
