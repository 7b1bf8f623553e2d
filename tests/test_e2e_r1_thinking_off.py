"""An R1-era model with thinking switched off, on MindIE (delta and full-text) and Siliconstorm: the whole answer is
text on every client dialect — Chat `content`, the Responses `message` item, the Messages `text` block — and no
reasoning (docs/mindie.md "Reasoning"). The MindIE mock answers such a request without reasoning and without
`</think>`, as MindIE does when the request's `chat_template_kwargs.enable_thinking` is false."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import pytest

from tests.conftest import Mock, Proxy

MODEL = "DeepSeek-R1"
KINDS = ["mindie", "mindie-fulltext", "siliconstorm"]
QUESTION = "What is 2+2? [mock:chunks=6]"
ANSWER = "tok0 tok1 tok2 tok3 tok4 tok5"


@pytest.fixture
def stack(start_mock: Callable[..., Mock], start_proxy: Callable[..., Proxy]) -> Iterator[Callable[[str], Any]]:
    clients: list[anthropic.Anthropic] = []

    def make(kind: str) -> tuple[Mock, Proxy, anthropic.Anthropic]:
        dialect, _, variant = kind.partition("-")
        mock = start_mock(dialect, full_text=variant == "fulltext")
        proxy = start_proxy(mock=mock, full_text=variant == "fulltext")
        client = anthropic.Anthropic(base_url=proxy.url, api_key="sk-client-key", max_retries=0, timeout=30)
        clients.append(client)
        return mock, proxy, client

    yield make
    for client in clients:
        client.close()


def switched_off(mock: Mock) -> None:
    kwargs = mock.last_request()["body"].get("chat_template_kwargs")
    assert kwargs == {"enable_thinking": False}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stream", [False, True])
def test_chat_reasoning_effort_none(stack: Callable[[str], Any], kind: str, stream: bool) -> None:
    mock, proxy, _ = stack(kind)
    messages = [{"role": "user", "content": QUESTION}]
    client = proxy.client()
    if stream:
        chunks = list(client.chat.completions.create(model=MODEL, messages=messages, reasoning_effort="none",
                                                     stream=True))
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    else:
        message = client.chat.completions.create(model=MODEL, messages=messages, reasoning_effort="none")
        content = message.choices[0].message.content or ""
        reasoning = getattr(message.choices[0].message, "reasoning_content", None) or ""
    assert (content, reasoning) == (ANSWER, "")
    switched_off(mock)
    # Thinking left on, the same model's answer is reasoning up to the template's lone `</think>`, then text.
    on = client.chat.completions.create(model=MODEL, messages=messages)
    assert on.choices[0].message.content == ANSWER
    assert getattr(on.choices[0].message, "reasoning_content", None)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stream", [False, True])
def test_responses_reasoning_effort_none(stack: Callable[[str], Any], kind: str, stream: bool) -> None:
    mock, proxy, _ = stack(kind)
    client = proxy.client()
    if stream:
        events = list(client.responses.create(model=MODEL, input=QUESTION, reasoning={"effort": "none"},
                                              stream=True))
        response = next(e.response for e in events if e.type == "response.completed")
        assert not [e for e in events if e.type.startswith("response.reasoning")]
    else:
        response = client.responses.create(model=MODEL, input=QUESTION, reasoning={"effort": "none"})
    assert response.output_text == ANSWER
    assert [item.type for item in response.output] == ["message"]
    switched_off(mock)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stream", [False, True])
def test_messages_thinking_disabled(stack: Callable[[str], Any], kind: str, stream: bool) -> None:
    mock, _, client = stack(kind)
    request: dict[str, Any] = {"model": MODEL, "max_tokens": 200, "thinking": {"type": "disabled"},
                               "messages": [{"role": "user", "content": QUESTION}]}
    if stream:
        with client.messages.stream(**request) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**request)
    assert [(block.type, getattr(block, "text", None)) for block in message.content] == [("text", ANSWER)]
    switched_off(mock)
