"""End to end: the openai SDK's Responses API -> proxy `/v1/responses` -> the built-in mock of every upstream kind.

What a Responses client sees: items in order (reasoning before the message), the SDK's stream helper accepting the
event sequence, tool round trips, conversation state, errors as the SDK's own exceptions (mid-stream too).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import Mock, Proxy

DIALECTS = ["openai", "mindie", "mindie+full_text", "siliconstorm", "deepseek", "engine"]
TOOL = {"type": "function", "name": "get_weather", "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


USER = {"role": "user", "content": "Weather?"}


def greeting(dialect: str) -> str:
    return f"Hello from the mock {dialect.partition('+')[0]} upstream! 你好, 世界 🌍."



def raw_events(proxy: Proxy, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of a streamed answer, read without the SDK."""
    events: list[tuple[str, dict[str, Any]]] = []
    with httpx.stream("POST", proxy.base_url + "/responses", json={**body, "stream": True}, timeout=30) as r:
        assert r.status_code == 200
        name = ""
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                events.append((name, json.loads(line[6:])))
    return events


@pytest.mark.parametrize("dialect", DIALECTS)
def test_text_answer_stream_and_not(stack: Callable[..., tuple[Mock, Proxy]], dialect: str) -> None:
    _, proxy = stack(dialect)
    client = proxy.client()
    response = client.responses.create(model="m", input="Hello!", instructions="Be brief.")
    assert response.status == "completed" and response.output_text == greeting(dialect)
    thinks = dialect == "deepseek"  # today's DeepSeek thinks unless told not to
    assert [item.type for item in response.output] == ["reasoning", "message"] if thinks else ["message"]
    assert response.id.startswith("resp_") and response.instructions == "Be brief."
    assert response.usage is not None and response.usage.output_tokens > 0 and response.usage.input_tokens > 0
    with client.responses.stream(model="m", input="Hello!") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == greeting(dialect)
    assert final.usage is not None and final.usage.output_tokens > 0


def test_response_object_repeats_the_request_with_openai_defaults(stack: Callable[..., tuple[Mock, Proxy]]) -> None:
    """The fields a response object echoes: OpenAI's defaults when the request leaves them out, the request's own
    values when it sets them; the same in the stream's head, its terminal event and the stored object."""
    _, proxy = stack("openai")
    client = proxy.client()
    plain = client.responses.create(model="m", input="Hello!")
    assert (plain.instructions, plain.max_output_tokens, plain.metadata, plain.parallel_tool_calls,
            plain.previous_response_id, plain.store, plain.temperature, plain.tool_choice, plain.tools,
            plain.top_p, plain.truncation, plain.user) == (None, None, {}, True, None, True, 1.0, "auto", [], 1.0,
                                                           "disabled", None)
    assert plain.reasoning is not None and (plain.reasoning.effort, plain.reasoning.summary) == (None, None)
    assert plain.text is not None and plain.text.format is not None and plain.text.format.type == "text"
    given: dict[str, Any] = dict(
        instructions="Be brief.", max_output_tokens=64, metadata={"k": "v"}, parallel_tool_calls=False,
        previous_response_id=plain.id, temperature=0.25, top_p=0.5, tools=[TOOL], tool_choice="none",
        reasoning={"effort": "low"}, text={"format": {"type": "text"}, "verbosity": "low"}, user="u-1")
    answers = [client.responses.create(model="m", input="Again", **given)]
    with client.responses.stream(model="m", input="Again", **given) as stream:
        head = [e.response for e in stream if e.type in ("response.created", "response.in_progress")]
        answers += [*head, stream.get_final_response()]
    answers.append(client.responses.retrieve(answers[-1].id))
    for answer in answers:
        assert (answer.instructions, answer.max_output_tokens, answer.metadata, answer.parallel_tool_calls,
                answer.previous_response_id, answer.temperature, answer.top_p, answer.tool_choice,
                answer.user) == ("Be brief.", 64, {"k": "v"}, False, plain.id, 0.25, 0.5, "none", "u-1")
        assert [t.name for t in answer.tools if t.type == "function"] == ["get_weather"]
        assert answer.reasoning is not None and answer.reasoning.effort == "low"
        assert answer.text is not None and answer.text.verbosity == "low"
        assert answer.text.format is not None and answer.text.format.type == "text"


def test_event_sequence_is_complete_and_numbered(stack: Callable[..., tuple[Mock, Proxy]]) -> None:
    _, proxy = stack("mindie+full_text")
    events = raw_events(proxy, {"model": "m", "input": "Hi [mock:think]"})
    names = [name for name, _ in events]
    assert [data["type"] for _, data in events] == names
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert names[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert names[-1] == "response.completed"
    reasoning_done = names.index("response.reasoning_text.done")
    message_added = [i for i, (n, d) in enumerate(events) if n == "response.output_item.added"
                     and d["item"]["type"] == "message"][0]
    assert reasoning_done < message_added  # the reasoning item is done before the message starts
    final = events[-1][1]["response"]
    assert [item["type"] for item in final["output"]] == ["reasoning", "message"]
    reasoning = "".join(d["delta"] for n, d in events if n == "response.reasoning_text.delta")
    assert final["output"][0]["content"][0]["text"] == reasoning and reasoning
    assert "<think>" not in final["output"][1]["content"][0]["text"]


def test_raw_reasoning_events_follow_the_responses_spec(start_mock: Callable[..., Mock],
                                                        start_proxy: Callable[..., Proxy]) -> None:
    """Where the two Responses specifications name the raw-reasoning events differently (client.responses_spec):
    OpenAI's `response.reasoning_text.*` by default, which the openai SDK types; Open Responses'
    `response.reasoning.*` (same fields) with `open_responses`. Everything else in the stream is the same, and the
    summary events (one name in both specifications) do not change."""
    mock = start_mock("mindie", full_text=True)
    default = start_proxy(mock=mock, full_text=True)
    spec = start_proxy(mock=mock, full_text=True, client={"responses_spec": "open_responses"})
    body = {"model": "m", "input": "Hi [mock:think]"}
    with default.client().responses.stream(**body) as stream:  # type: ignore[call-overload]
        typed = [e for e in stream if e.type.startswith("response.reasoning")]
        final = stream.get_final_response()
    reasoning = final.output[0].content[0].text  # type: ignore[union-attr,index]
    assert reasoning and [type(e).__name__ for e in typed] == [
        *["ResponseReasoningTextDeltaEvent"] * (len(typed) - 1), "ResponseReasoningTextDoneEvent"]
    assert "".join(e.delta for e in typed[:-1]) == reasoning == typed[-1].text  # type: ignore[union-attr]

    openai_events = raw_events(default, body)
    spec_events = raw_events(spec, body)
    renamed = {"response.reasoning_text.delta": "response.reasoning.delta",
               "response.reasoning_text.done": "response.reasoning.done"}
    names = [name for name, _ in spec_events]
    assert names == [renamed.get(name, name) for name, _ in openai_events]
    assert names.count("response.reasoning.done") == 1 and "response.reasoning.delta" in names
    assert not [name for name in names if name.startswith("response.reasoning_text")]
    deltas = [d for n, d in spec_events if n == "response.reasoning.delta"]
    done = next(d for n, d in spec_events if n == "response.reasoning.done")
    item_id = spec_events[-1][1]["response"]["output"][0]["id"]
    # Open Responses' ResponseReasoningDeltaStreamingEvent / ...DoneStreamingEvent fields, and nothing else
    assert all(set(d) == {"type", "sequence_number", "item_id", "output_index", "content_index", "delta"}
               and d["type"] == "response.reasoning.delta" and d["item_id"] == item_id for d in deltas)
    assert set(done) == {"type", "sequence_number", "item_id", "output_index", "content_index", "text"}
    assert "".join(d["delta"] for d in deltas) == done["text"] == reasoning
    assert spec_events[-1][1]["response"]["output"][0]["content"] == [{"type": "reasoning_text", "text": reasoning}]
    summary = [n for n, _ in raw_events(spec, {**body, "reasoning": {"summary": "auto"}})]
    assert "response.reasoning_summary_text.delta" in summary and "response.reasoning.delta" not in summary


@pytest.mark.parametrize("dialect", DIALECTS)
def test_tool_round_trip_with_function_call_output(stack: Callable[..., tuple[Mock, Proxy]], dialect: str) -> None:
    mock, proxy = stack(dialect)
    client = proxy.client()
    first = client.responses.create(model="m", tools=[TOOL],  # type: ignore[list-item]
                                    input='Weather? [mock:call_tool=get_weather {"city": "Oslo"}]')
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and json.loads(calls[0].arguments) == {"city": "Oslo"}
    assert calls[0].call_id and calls[0].status == "completed"
    history: list[Any] = [{"role": "user", "content": 'Weather? [mock:call_tool=get_weather {"city": "Oslo"}]'},
                          *[item.model_dump(exclude_none=True) for item in first.output],
                          {"type": "function_call_output", "call_id": calls[0].call_id, "output": "12 C, rain"}]
    second = client.responses.create(model="m", tools=[TOOL], input=history)  # type: ignore[list-item]
    assert second.output_text == "Tool get_weather returned: 12 C, rain"
    messages = mock.last_request()["body"]["messages"]
    assert messages[-1]["role"] == "tool" and messages[-1]["content"] == "12 C, rain"


def test_streamed_tool_call_events(stack: Callable[..., tuple[Mock, Proxy]]) -> None:
    _, proxy = stack("mindie")
    events = raw_events(proxy, {"model": "m", "tools": [TOOL], "input": "Weather? [mock:call_tool]"})
    args = "".join(d["delta"] for n, d in events if n == "response.function_call_arguments.delta")
    done = [d for n, d in events if n == "response.function_call_arguments.done"]
    assert json.loads(args) == {"city": "Paris"} and done[0]["arguments"] == args
    final = events[-1][1]["response"]
    assert final["status"] == "completed" and final["output"][-1]["type"] == "function_call"


def test_previous_response_id_continues_the_conversation(stack: Callable[..., tuple[Mock, Proxy]]) -> None:
    mock, proxy = stack("deepseek")
    client = proxy.client()
    first = client.responses.create(model="m", tools=[TOOL],  # type: ignore[list-item]
                                    input="Weather in Oslo? [mock:call_tool]")
    call = next(item for item in first.output if item.type == "function_call")
    second = client.responses.create(
        model="m", tools=[TOOL], previous_response_id=first.id,  # type: ignore[list-item]
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert second.output_text == "Tool get_weather returned: sunny" and second.previous_response_id == first.id
    messages = mock.last_request()["body"]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["id"] == call.call_id
    # stored: GET answers; DELETE removes; then both are 404 and continuing is a 400
    assert client.responses.retrieve(first.id).output[-1].type == "function_call"
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(first.id)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="m", previous_response_id=first.id, input="again")
    assert info.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert info.value.body["code"] == "previous_response_not_found"  # type: ignore[index]
    assert "own process's memory (state_store: memory)" in info.value.body["message"]  # type: ignore[index]


@pytest.mark.parametrize("dialect", ["mindie+full_text", "deepseek"])
def test_a_summary_asked_for_carries_the_reasoning(stack: Callable[..., tuple[Mock, Proxy]], dialect: str) -> None:
    """`reasoning.summary` (Codex sends "auto"; the Vercel AI SDK shows reasoning only from summaries): the reasoning
    comes as the item's one summary_text part, with the summary events, and no reasoning_text."""
    mock, proxy = stack(dialect)
    client = proxy.client()
    plain = client.responses.create(model="m", input="Hi [mock:think]")
    expected = plain.output[0].content[0].text  # type: ignore[union-attr,index]
    answer = client.responses.create(model="m", input="Hi [mock:think]", reasoning={"summary": "auto"})
    item = answer.output[0]
    assert item.type == "reasoning" and [(p.type, p.text) for p in item.summary] == [("summary_text", expected)]
    assert not item.content and answer.output_text == plain.output_text
    events = raw_events(proxy, {"model": "m", "input": "Hi [mock:think]", "reasoning": {"summary": "detailed"}})
    names = [name for name, _ in events]
    assert "response.reasoning_text.delta" not in names and "response.reasoning_text.done" not in names
    first = names.index("response.reasoning_summary_part.added")
    last = names.index("response.reasoning_summary_part.done")
    deltas = [d for n, d in events if n == "response.reasoning_summary_text.delta"]
    assert "".join(d["delta"] for d in deltas) == expected and len(deltas) > 1
    assert all(first < names.index(n) < last for n in ("response.reasoning_summary_text.delta",
                                                        "response.reasoning_summary_text.done"))
    assert all(d["summary_index"] == 0 and d["item_id"] == events[first][1]["item_id"] for d in deltas)
    assert events[-1][1]["response"]["output"][0]["summary"] == [{"type": "summary_text", "text": expected}]
    # The SDK's stream helper folds the same events into the same response.
    with client.responses.stream(model="m", input="Hi [mock:think]", reasoning={"summary": "concise"}) as stream:
        final = stream.get_final_response()
    assert final.output[0].summary[0].text == expected  # type: ignore[union-attr]
    # The next turn's history has it as the assistant's reasoning, as with reasoning_text (a tool-call turn's
    # reasoning goes back upstream: DeepSeek's thinking mode needs it, see docs/responses.md).
    called = client.responses.create(model="m", tools=[TOOL],  # type: ignore[list-item]
                                     input="Weather? [mock:reasoning_field,call_tool]", reasoning={"summary": "auto"})
    call = called.output[-1]
    assert called.output[0].type == "reasoning" and call.type == "function_call"
    client.responses.create(model="m", tools=[TOOL], previous_response_id=called.id,  # type: ignore[list-item]
                            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    turn = mock.last_request()["body"]["messages"][1]
    assert turn["tool_calls"][0]["id"] == call.call_id
    assert turn["reasoning_content"] == called.output[0].summary[0].text  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="m", input="Hi", reasoning={"summary": 3})  # type: ignore[typeddict-item]
    assert info.value.body["param"] == "reasoning.summary"  # type: ignore[index]


def test_item_references_stand_for_the_stored_items(stack: Callable[..., tuple[Mock, Proxy]]) -> None:
    """The Vercel AI SDK sends earlier turns' items as `item_reference`s (store on): each becomes the item itself."""
    mock, proxy = stack("openai")
    client = proxy.client()
    first = client.responses.create(model="m", tools=[TOOL],  # type: ignore[list-item]
                                    input="Weather? [mock:reasoning_field,call_tool]")
    reasoning, call = first.output
    assert reasoning.type == "reasoning" and call.type == "function_call"
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    second = client.responses.create(model="m", tools=[TOOL], input=[  # type: ignore[list-item]
        {"role": "user", "content": "Weather? [mock:reasoning_field,call_tool]"},
        {"type": "item_reference", "id": reasoning.id}, {"type": "item_reference", "id": call.id}, output])
    assert second.output_text.endswith("Tool get_weather returned: sunny")
    messages = mock.last_request()["body"]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["id"] == call.call_id
    assert messages[1]["reasoning_content"] == reasoning.content[0].text  # type: ignore[index]
    # A message item by reference: its text is the assistant turn.
    client.responses.create(model="m", input=[
        {"role": "user", "content": "Hi"}, {"type": "item_reference", "id": second.output[-1].id},
        {"role": "user", "content": "And?"}])
    assert mock.last_request()["body"]["messages"][1] == {"role": "assistant", "content": second.output_text}
    # Unknown ids, and items of a response that was not stored, are a 400 naming the reference.
    unstored = client.responses.create(model="m", input="Hi", store=False)
    for item_id in ("msg_nothing", first.id, unstored.output[0].id, call.id[:-2] + "77"):
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model="m", input=[{"type": "item_reference", "id": item_id}])
        assert info.value.body["param"] == "input[0].id"  # type: ignore[index]
        assert info.value.body["code"] == "item_not_found"  # type: ignore[index]


def test_store_false_keeps_nothing(stack: Callable[..., tuple[Mock, Proxy]]) -> None:
    _, proxy = stack("openai")
    client = proxy.client()
    response = client.responses.create(model="m", input="Hello!", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


@pytest.mark.parametrize("dialect", ["openai", "mindie+full_text", "deepseek"])
def test_failure_after_the_head_raises_in_the_sdk(stack: Callable[..., tuple[Mock, Proxy]], dialect: str) -> None:
    _, proxy = stack(dialect)
    client = proxy.client()
    seen: list[str] = []
    with pytest.raises(openai.APIError) as info:
        stream = client.responses.create(model="m", input="Hi [mock:drop=4]", stream=True,
                                         reasoning={"effort": "none"})  # text, also on DeepSeek
        for event in stream:
            seen.append(event.type)
    assert "response.output_text.delta" in seen and "response.completed" not in seen
    assert "upstream" in str(info.value).lower()
    with pytest.raises(openai.InternalServerError):  # not streamed: a 502 envelope
        client.responses.create(model="m", input="Hi [mock:drop=4]")


def test_errors_are_the_sdks_exceptions(stack: Callable[..., tuple[Mock, Proxy]]) -> None:
    _, proxy = stack("openai")
    client = proxy.client()
    with pytest.raises(openai.RateLimitError):
        client.responses.create(model="m", input="Hi [mock:error=429]")
    with pytest.raises(openai.RateLimitError):
        client.responses.create(model="m", input="Hi [mock:error=429]", stream=True)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="m", input=[{"type": "message", "role": "robot", "content": "x"}])
    assert info.value.body["param"] == "input[0].role"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="m", input="x", background=True)
    assert info.value.body["param"] == "background"  # type: ignore[index]


def test_length_is_incomplete(stack: Callable[..., tuple[Mock, Proxy]]) -> None:
    _, proxy = stack("mindie")
    client = proxy.client()
    response = client.responses.create(model="m", input="Hello!", max_output_tokens=3)
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    events = raw_events(proxy, {"model": "m", "input": "Hello!", "max_output_tokens": 3})
    assert events[-1][0] == "response.incomplete"
    assert events[-1][1]["response"]["output"][0]["status"] == "incomplete"


def test_hosted_tools_are_left_out_and_named(stack: Callable[..., tuple[Mock, Proxy]]) -> None:
    mock, proxy = stack("mindie")
    body = {"model": "m", "input": "Hi", "tools": [{"type": "web_search"}, TOOL]}
    r = httpx.post(proxy.base_url + "/responses", json=body, timeout=30)
    assert r.status_code == 200 and r.headers["x-dialect-proxy-ignored-tools"] == "web_search"
    assert [t["function"]["name"] for t in mock.last_request()["body"]["tools"]] == ["get_weather"]
    forced = httpx.post(proxy.base_url + "/responses", timeout=30,
                        json={**body, "tool_choice": {"type": "web_search_preview"}})
    assert forced.status_code == 400 and forced.json()["error"]["param"] == "tool_choice"


def test_namespace_tools_are_flattened_and_named_back(stack: Callable[..., tuple[Mock, Proxy]]) -> None:
    mock, proxy = stack("openai")
    spawn = {"type": "function", "name": "spawn", "parameters": {"type": "object", "properties": {}}}
    tools = [{"type": "namespace", "name": "agents", "description": "sub-agents", "tools": [spawn]}]
    r = httpx.post(proxy.base_url + "/responses", timeout=30,
                   json={"model": "m", "input": "Go [mock:call_tool=spawn]", "tools": tools}).json()
    call = r["output"][-1]
    assert call["type"] == "function_call" and call["name"] == "spawn" and call["namespace"] == "agents"
    assert mock.last_request()["body"]["tools"][0]["function"]["name"] == "spawn"


def test_text_format_becomes_response_format(stack: Callable[..., tuple[Mock, Proxy]]) -> None:
    mock, proxy = stack("openai")
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    httpx.post(proxy.base_url + "/responses", timeout=30, json={
        "model": "m", "input": "Hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}}})
    assert mock.last_request()["body"]["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def test_reasoning_comes_back_only_when_sealed_by_us(stack: Callable[..., tuple[Mock, Proxy]]) -> None:
    mock, proxy = stack("openai")
    client = proxy.client()
    first = client.responses.create(model="m", tools=[TOOL], include=["reasoning.encrypted_content"],  # type: ignore
                                    input="Weather? [mock:reasoning_field,call_tool]", store=False)
    items = [item.model_dump(exclude_none=True) for item in first.output]
    assert [i["type"] for i in items] == ["reasoning", "function_call"]
    reasoning = items[0]["content"][0]["text"]
    assert reasoning and items[0]["encrypted_content"]
    output = {"type": "function_call_output", "call_id": items[1]["call_id"], "output": "ok"}
    client.responses.create(model="m", tools=[TOOL], input=[USER, *items, output],  # type: ignore
                            store=False)
    turn = mock.last_request()["body"]["messages"][1]
    assert turn["role"] == "assistant" and turn.get("reasoning_content") == reasoning
    forged = {**items[0], "encrypted_content": "not ours", "content": [{"type": "reasoning_text", "text": "lies"}]}
    client.responses.create(model="m", tools=[TOOL], input=[USER, forged, items[1], output],  # type: ignore
                            store=False)
    assert "reasoning_content" not in mock.last_request()["body"]["messages"][1]


def test_route_in_metrics(stack: Callable[..., tuple[Mock, Proxy]]) -> None:
    _, proxy = stack("openai")
    proxy.client().responses.create(model="m", input="Hello!")
    metrics = httpx.get(proxy.url + "/metrics", timeout=10).text
    assert 'route="/v1/responses"' in metrics
