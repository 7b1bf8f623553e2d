"""`[mock:call_tool]`: a call to whatever tool the request offers, then a text that quotes the tool's result."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from mockutil import MockServer, chat, parse_sse
from test_mock_common import request_for

from proxy.mock.scenario import from_chat, parse
from proxy.mock.toolcall import example

SHELL = {"type": "object", "properties": {
    "command": {"type": "array", "items": {"type": "string"}},
    "workdir": {"type": "string"},
    "timeout_ms": {"type": "integer", "minimum": 100}}, "required": ["command", "timeout_ms"]}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                            "unit": {"type": "string", "enum": ["fahrenheit", "celsius"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "shell", "description": "run a command", "parameters": SHELL}},
         {"type": "function", "function": {"name": "lookup_weather", "parameters": WEATHER}}]
# every mock dialect that supports tools, full-text modes included
TOOL_DIALECTS = ["openai", "mindie", "mindie+full_text", "siliconstorm", "siliconstorm+full_text", "deepseek",
                 "engine"]


# ------------------------------------------------------------------------------------------------------ parsing

def test_call_tool_directive_reads_json_arguments_whole() -> None:
    assert parse("x [mock:call_tool]").flags == {"call_tool": ""}
    assert parse("[mock:call_tool=shell]").flags == {"call_tool": "shell"}
    sc = parse('run [mock:delay_ms=5, call_tool=shell {"command": ["echo", "a, b]"]} , think] [mock:chunks=2]')
    assert sc.flags == {"delay_ms": "5", "call_tool": 'shell {"command": ["echo", "a, b]"]}', "think": "",
                        "chunks": "2"}
    assert parse('[mock:call_tool {"a": 1}]').flags == {"call_tool": ' {"a": 1}'}
    assert parse("[mock:call_tool=x {not json}]").flags == {"call_tool": "x"}
    assert parse("[mock:call_tools=3]").flags == {"call_tools": "3"}  # another key, not call_tool
    assert parse('[mock:call_tool=shell {"a": 1}').flags == {}  # never closed


def test_directives_of_earlier_user_messages_in_the_same_turn() -> None:
    wrapped = {"messages": [{"role": "developer", "content": "[mock:think]"},
                            {"role": "user", "content": "context"},
                            {"role": "user", "content": [{"type": "text", "text": "do it [mock:call_tool]"}]},
                            {"role": "user", "content": "<environment_context/>"},
                            {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                                                                                    "function": {"name": "shell",
                                                                                                 "arguments": "{}"}}]},
                            {"role": "tool", "tool_call_id": "c", "content": "done"}]}
    assert from_chat(wrapped).flags == {"call_tool": ""}
    # a finished answer ends the turn: a new question without directives gets the default reply
    later = {"messages": [*wrapped["messages"], {"role": "assistant", "content": "Tool shell returned: done"},
                          {"role": "user", "content": "thanks"}]}
    assert from_chat(later).flags == {}
    # the last user message's own directives win
    assert from_chat({"messages": [{"role": "user", "content": "[mock:think]"},
                                   {"role": "user", "content": "[mock:chunks=3]"}]}).flags == {"chunks": "3"}


def test_example_arguments_follow_the_schema() -> None:
    assert example(SHELL, root=SHELL) == {"command": ["echo", "hello from the mock"], "timeout_ms": 100}
    assert example(WEATHER, root=WEATHER) == {"city": "Paris", "unit": "fahrenheit"}
    schema = {"type": "object", "required": ["n", "x", "flag", "tags", "when", "opt", "item", "cmd", "nothing"],
              "properties": {"n": {"type": "integer", "exclusiveMinimum": 4}, "x": {"type": "number", "maximum": 0.5},
                             "flag": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "integer"}},
                             "when": {"type": "string", "default": "now"},
                             "opt": {"anyOf": [{"type": "null"}, {"type": "string"}]},
                             "item": {"$ref": "#/$defs/Item"}, "cmd": {"type": ["string", "null"]},
                             "nothing": {"type": "null"}, "unused": {"type": "string"}},
              "$defs": {"Item": {"type": "object", "properties": {"k": {"const": 7}}, "required": ["k"]}}}
    assert example(schema, root=schema) == {"n": 5, "x": 0.5, "flag": True, "tags": [1], "when": "now",
                                            "opt": "mock", "item": {"k": 7}, "cmd": "echo hello from the mock",
                                            "nothing": None}
    assert example({}, root={}) == "mock" and example({"type": "object"}) == {}


# ------------------------------------------------------------------------------------------- over the wire

def _server(mock_servers: Any, dialect: str) -> tuple[MockServer, str]:
    name, _, mode = dialect.partition("+")
    return mock_servers(name, full_text=bool(mode)), name


def _answer(events: list[Any], full_text: bool) -> tuple[str, list[dict[str, Any]], str | None]:
    """(content, tool calls, finish_reason) of choice 0 of a chat stream, joined the way a client does."""
    content, finish = "", None
    calls: dict[int, dict[str, Any]] = {}
    for event in events:
        if not isinstance(event, dict):
            continue
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str):  # full-text mode: every delta is the whole text so far
                content = (text or content) if full_text else content + text
            for call in delta.get("tool_calls") or ():
                slot = calls.setdefault(call.get("index", 0), {"id": None, "name": "", "arguments": ""})
                slot["id"] = call.get("id") or slot["id"]
                fn = call.get("function") or {}
                slot["name"] += fn.get("name") or ""
                slot["arguments"] += fn.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    return content, [calls[k] for k in sorted(calls)], finish


def _tool_request(dialect: str, text: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    path, body = request_for(dialect, text, tools=TOOLS, **extra)
    return path, body


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("dialect", TOOL_DIALECTS)
def test_call_tool_calls_the_first_offered_tool_with_schema_arguments(mock_servers: Any, dialect: str,
                                                                      stream: bool) -> None:
    srv, name = _server(mock_servers, dialect)
    path, body = _tool_request(name, "list files [mock:call_tool]", stream=stream)
    resp = srv.post(path, body)
    assert resp.status_code == 200, resp.text
    if stream:
        content, calls, finish = _answer(parse_sse(resp.text), "full_text" in dialect)
        assert content == ""
    else:
        choice = resp.json()["choices"][0]
        finish = choice["finish_reason"]
        calls = [{"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                 for c in choice["message"]["tool_calls"]]
        assert not choice["message"]["content"]
    assert finish == "tool_calls"
    (call,) = calls
    assert call["name"] == "shell" and call["id"].startswith("call_")
    assert orjson.loads(call["arguments"]) == {"command": ["echo", "hello from the mock"], "timeout_ms": 100}


@pytest.mark.parametrize("dialect", TOOL_DIALECTS)
def test_call_tool_by_name_with_given_arguments(mock_servers: Any, dialect: str) -> None:
    srv, name = _server(mock_servers, dialect)
    path, body = _tool_request(name, "[mock:call_tool=lookup_weather]", stream=True)
    _, calls, _ = _answer(srv.stream(path, body)[1], "full_text" in dialect)
    assert [(c["name"], orjson.loads(c["arguments"])) for c in calls] == [("lookup_weather",
                                                                          {"city": "Paris", "unit": "fahrenheit"})]
    given = '{"command": ["touch", "/tmp/x, y"], "timeout_ms": 5}'
    path, body = _tool_request(name, f"go [mock:call_tool=shell {given}]")
    (call,) = srv.post(path, body).json()["choices"][0]["message"]["tool_calls"]
    assert call["function"] == {"name": "shell", "arguments": given}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("dialect", TOOL_DIALECTS)
def test_call_tool_quotes_the_tool_result(mock_servers: Any, dialect: str, stream: bool) -> None:
    srv, name = _server(mock_servers, dialect)
    path, body = _tool_request(name, "list files [mock:call_tool]", stream=stream)
    call = {"id": "call_abc", "type": "function", "function": {"name": "shell", "arguments": "{}"}}
    body["messages"] += [{"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "call_abc", "content": "marker-7f3a written\n"}]
    if name == "deepseek":
        body["messages"][-2]["content"] = ""
    resp = srv.post(path, body)
    assert resp.status_code == 200, resp.text
    if stream:
        content, calls, finish = _answer(parse_sse(resp.text), "full_text" in dialect)
    else:
        choice = resp.json()["choices"][0]
        content, finish = choice["message"]["content"], choice["finish_reason"]
        calls = choice["message"].get("tool_calls") or []
    assert content == "Tool shell returned: marker-7f3a written\n"
    assert calls == [] and finish == "stop"


@pytest.mark.parametrize("dialect", ["openai", "mindie"])
def test_call_tool_without_directive_is_the_default_reply(mock_servers: Any, dialect: str) -> None:
    srv, name = _server(mock_servers, dialect)
    path, body = _tool_request(name, "hi")  # no directive in this turn: the default reply, tools or not
    message = srv.post(path, body).json()["choices"][0]["message"]
    assert message["content"].startswith("Hello from the mock") and not message.get("tool_calls")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("dialect", TOOL_DIALECTS)
def test_a_request_without_tools_is_never_answered_with_a_tool_call(mock_servers: Any, dialect: str,
                                                                    stream: bool) -> None:
    """A model can only call a tool it was given: a chat request with no `tools` (or `tool_choice: none`) gets text,
    whatever tool-call directive counts for it — its own, one of an earlier user message of the turn (a client's
    summary request after a tool turn, as Codex's remote compaction sends), or a server-wide one."""
    srv, name = _server(mock_servers, dialect)
    full_text = "full_text" in dialect

    def answer(body: dict[str, Any]) -> tuple[str, list[dict[str, Any]], str | None]:
        if stream:
            return _answer(parse_sse(srv.post(path, {**body, "stream": True}).text), full_text)
        choice = srv.post(path, body).json()["choices"][0]
        calls = [{"name": c["function"]["name"]} for c in choice["message"].get("tool_calls") or ()]
        return choice["message"]["content"], calls, choice["finish_reason"]

    for directive in ("[mock:call_tool]", "[mock:call_tool=shell {\"command\": [\"ls\"]}]", "[mock:tool_calls=2]",
                      "[mock:tool_calls_noindex]"):
        path, body = request_for(name, f"list files {directive}")
        content, calls, finish = answer(body)
        assert calls == [] and finish == "stop" and content.startswith("Hello from the mock"), (directive, content)
        path, body = _tool_request(name, f"list files {directive}", tool_choice="none")
        content, calls, finish = answer(body)
        assert calls == [] and finish == "stop" and content.startswith("Hello from the mock"), (directive, content)
    # the earlier user message of the turn asked for a tool call; the summary request offers no tools
    path, body = request_for(name, "[mock:call_tool]")
    body["messages"] += [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "shell", "arguments": '{"command": ["ls"]}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "README.md"},
        {"role": "user", "content": "Summarise the conversation so far."}]
    content, calls, finish = answer(body)
    assert calls == [] and finish == "stop" and content.startswith("Hello from the mock")
    # with tools, the same conversation is still an agent turn
    content, calls, finish = answer({**body, "tools": TOOLS})
    assert [c["name"] for c in calls] == ["shell"] and finish == "tool_calls"


@pytest.mark.parametrize("dialect", ["openai", "mindie", "mindie+full_text", "siliconstorm"])
def test_call_tool_on_an_r1_named_model_reasons_then_calls(mock_servers: Any, dialect: str) -> None:
    """An R1-named model (whose template opens `<think>`: scenario.r1_thinking) makes the call asked for too."""
    srv, name = _server(mock_servers, dialect)
    path, body = _tool_request(name, "list files [mock:call_tool]", model="DeepSeek-R1")
    message = srv.post(path, body).json()["choices"][0]["message"]
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "shell" and orjson.loads(call["function"]["arguments"])["command"]


def test_server_wide_call_tool_calls_only_where_tools_are_offered(mock_servers: Any) -> None:
    """`call_tool` set server-wide (POST /_mock/directives, `dialect-proxy mock --directives`): an agent turn for a
    request that offers tools, resolved against that request; the default reply for one that offers none."""
    srv = mock_servers("mindie", full_text=True)
    assert srv.post("/_mock/directives", {"directives": "call_tool"}).status_code == 200
    try:
        message = srv.post("/v1/chat/completions", chat("hi", tools=TOOLS)).json()["choices"][0]["message"]
        (call,) = message["tool_calls"]
        assert call["function"]["name"] == "shell" and orjson.loads(call["function"]["arguments"])["command"]
        message = srv.post("/v1/chat/completions", chat("hi")).json()["choices"][0]["message"]
        assert message["content"].startswith("Hello from the mock") and not message.get("tool_calls")
    finally:
        srv.post("/_mock/directives", {"directives": ""})


def test_call_tool_after_an_assistant_prefix_does_nothing(mock_servers: Any) -> None:
    srv = mock_servers("openai")
    body = chat("[mock:call_tool]", tools=TOOLS)
    body["messages"].append({"role": "assistant", "content": "Sure"})
    message = srv.post("/v1/chat/completions", body).json()["choices"][0]["message"]
    assert message["content"].startswith("Hello from the mock") and "tool_calls" not in message
