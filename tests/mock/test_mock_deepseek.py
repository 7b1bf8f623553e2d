"""The mock DeepSeek API: strict validation, today's models and thinking mode, R1-era rules, keep-alives, usage in the
last chunk."""

from __future__ import annotations

from typing import Any

import pytest
from mockutil import MockServer, chat

PATH = "/chat/completions"


OFF = {"type": "disabled"}
ON = {"type": "enabled"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def ds(text: str = "hi", model: str = "deepseek-flash", **extra: Any) -> dict[str, Any]:
    """A request in non-thinking mode unless `thinking` is given (thinking is DeepSeek's default)."""
    if "thinking" not in extra and "deepseek" in model and "r1" not in model:
        extra["thinking"] = OFF
    elif extra.get("thinking") is None:
        extra.pop("thinking", None)
    return chat(text, model=model, **extra)


def data(events: list[Any]) -> list[dict[str, Any]]:
    return [e for e in events if isinstance(e, dict)]


def bad(srv: MockServer, body: Any, fragment: str, status: int = 400) -> dict[str, Any]:
    resp = srv.post(PATH, body)
    assert resp.status_code == status, resp.text
    err: dict[str, Any] = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and fragment in err["message"], err
    return err


def test_non_stream(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("deepseek")
    body = srv.post(PATH, ds()).json()
    assert body["object"] == "chat.completion" and body["model"] == "deepseek-flash"
    assert body["system_fingerprint"].startswith("fp_")
    assert body["choices"][0]["message"] == {"role": "assistant",
                                             "content": "Hello from the mock deepseek upstream! 你好, 世界 🌍."}
    usage = body["usage"]
    assert usage["prompt_tokens"] == usage["prompt_cache_hit_tokens"] + usage["prompt_cache_miss_tokens"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": usage["prompt_cache_hit_tokens"]}
    for path in ("/v1/chat/completions", "/beta/chat/completions"):
        assert srv.post(path, ds()).status_code == 200


@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_stream(mock_servers: Any, include_usage: bool) -> None:
    srv: MockServer = mock_servers("deepseek")
    extra = {"stream_options": {"include_usage": True}} if include_usage else {}
    resp, events = srv.stream(PATH, ds("x [mock:chunks=3]", stream=True, **extra))
    assert resp.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert events[0] == (":comment", ": keep-alive")  # one keep-alive comment by default
    chunks = data(events)
    assert chunks[0]["choices"][0]["delta"] == {"content": "", "role": "assistant"} and chunks[0]["usage"] is None
    assert [c["choices"][0]["delta"] for c in chunks[1:4]] == [
        {"content": "tok0", "role": "assistant"}, {"content": " tok1", "role": "assistant"},
        {"content": " tok2", "role": "assistant"}]
    last = chunks[-1]
    assert last["choices"] and last["choices"][0]["finish_reason"] == "stop"  # non-empty choices + usage
    assert last["choices"][0]["delta"] == {"content": "", "role": None}
    assert last["usage"]["completion_tokens"] == 3 and "prompt_cache_hit_tokens" in last["usage"]
    middle = chunks[1:-1]
    if include_usage:
        assert all(c["usage"] is None for c in middle)
    else:
        assert all("usage" not in c for c in middle)
    assert events[-1] == "[DONE]"


def test_keepalive_directive(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("deepseek")
    _, events = srv.stream(PATH, ds("x [mock:chunks=3,keepalive]", stream=True))
    assert sum(1 for e in events if isinstance(e, tuple) and e[0] == ":comment") == 3 + 3
    resp = srv.post(PATH, ds("x [mock:keepalive]"))
    assert resp.content.startswith(b"\n") and resp.json()["object"] == "chat.completion"


def test_today_models_thinking_by_default_and_retired_names(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("deepseek")
    assert [m["id"] for m in srv.client.get("/models").json()["data"]] == [
        "deepseek-flash", "deepseek-v4-flash", "deepseek-v4-pro"]
    for model in ("deepseek-flash", "deepseek-v4-flash", "deepseek-v4-pro"):
        body = srv.post(PATH, ds(model=model, thinking=None)).json()
        assert body["choices"][0]["message"]["reasoning_content"], model  # thinking is on by default
        assert "reasoning_content" not in srv.post(PATH, ds(model=model)).json()["choices"][0]["message"]
    for retired in ("deepseek-chat", "deepseek-reasoner"):
        bad(srv, ds(model=retired), "Model Not Exist")
    for effort in ("low", "high", "max", "minimal", "medium", "xhigh"):
        assert srv.post(PATH, ds(thinking=None, reasoning_effort=effort)).status_code == 200
    bad(srv, ds(reasoning_effort="none"), "reasoning_effort", 422)
    # thinking mode ignores sampling parameters without error; non-thinking mode checks them
    assert srv.post(PATH, ds(thinking=ON, temperature=7, top_p=0, presence_penalty=9)).status_code == 200
    bad(srv, ds(temperature=7), "temperature")


def test_r1_stream(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("deepseek")
    _, events = srv.stream(PATH, ds("x [mock:chunks=2]", model="deepseek-r1", stream=True))
    deltas = [c["choices"][0]["delta"] for c in data(events)]
    assert deltas[0] == {"role": "assistant", "content": None, "reasoning_content": ""}
    for delta in deltas[1:-1]:
        assert (delta["content"] is None) != (delta["reasoning_content"] is None)  # exactly one is non-null
    kinds = ["r" if d["reasoning_content"] is not None else "c" for d in deltas[1:-1]]
    assert kinds == sorted(kinds, reverse=True) and "r" in kinds and kinds[-2:] == ["c", "c"]
    usage = data(events)[-1]["usage"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] == kinds.count("r")
    body = srv.post(PATH, ds(model="deepseek-r1")).json()
    assert body["choices"][0]["message"]["reasoning_content"]


def test_r1_rules(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("deepseek")
    r = "DeepSeek-R1-0528"
    bad(srv, {"model": r, "messages": [{"role": "user", "content": "a"},
                                       {"role": "assistant", "content": "b", "reasoning_content": "c"},
                                       {"role": "user", "content": "d"}]}, "reasoning_content")
    bad(srv, {"model": r, "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
        "successive user or assistant messages")
    bad(srv, ds(model=r, logprobs=True), "logprobs")
    bad(srv, ds(model=r, logprobs=True, top_logprobs=2), "logprobs")
    # the beta prefix continuation may carry reasoning_content on the last assistant message
    prefix = {"model": r, "messages": [{"role": "user", "content": "a"},
                                       {"role": "assistant", "content": "b", "reasoning_content": "c",
                                        "prefix": True}]}
    assert srv.post("/beta/chat/completions", prefix).status_code == 200
    # today's models tolerate both
    two = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert srv.post(PATH, {"model": "deepseek-flash", "messages": two}).status_code == 200


def test_thinking_mode_needs_the_reasoning_of_tool_call_turns_back(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("deepseek")
    body = srv.post(PATH, ds(thinking=ON)).json()
    assert body["choices"][0]["message"]["reasoning_content"]
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "", "tool_calls": [CALL]},
               {"role": "tool", "content": "r", "tool_call_id": "call_1"}]
    for thinking in (ON, None):  # explicit, or DeepSeek's default
        err = bad(srv, ds(thinking=thinking, messages=history), "must be passed back")
        assert err == {"message": "The `reasoning_content` in the thinking mode must be passed back to the API.",
                       "type": "invalid_request_error", "param": None, "code": "invalid_request_error"}
    assert srv.post(PATH, ds(thinking=OFF, messages=history)).status_code == 200  # non-thinking: not needed
    turn = {**history[1], "reasoning_content": "I should call f"}
    assert srv.post(PATH, ds(thinking=ON, messages=[history[0], turn, history[2]])).status_code == 200
    # an empty one does not count as passed back (the stricter reading of reports that differ)
    bad(srv, ds(thinking=ON, messages=[history[0], {**history[1], "reasoning_content": ""}, history[2]]),
        "must be passed back")
    # reasoning on a turn without tool calls is accepted (and ignored)
    plain = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "reasoning_content": "c"},
             {"role": "user", "content": "d"}]
    assert srv.post(PATH, ds(thinking=ON, messages=plain)).status_code == 200
    _, events = srv.stream(PATH, ds(thinking=ON, stream=True))
    assert data(events)[0]["choices"][0]["delta"]["reasoning_content"] == ""


def test_parameter_validation(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("deepseek")
    bad(srv, ds(stop=[str(i) for i in range(17)]), "16")
    assert srv.post(PATH, ds(stop=[str(i) for i in range(16)])).status_code == 200
    bad(srv, ds(max_tokens=0), "[1, 384000]")
    bad(srv, ds(max_tokens=384001), "[1, 384000]")
    assert srv.post(PATH, ds(max_tokens=384000, stream=True)).status_code == 200
    bad(srv, ds(temperature=2.1), "temperature")
    bad(srv, ds(top_logprobs=3), "logprobs")
    bad(srv, ds(stream_options={"include_usage": True}), "stream")
    bad(srv, ds(tools=[{"type": "function", "function": {"name": "bad name!"}}]), "name")
    bad(srv, {"model": "deepseek-flash", "messages": [{"role": "user", "content": "a"},
                                                      {"role": "assistant", "content": "b", "prefix": True},
                                                      {"role": "user", "content": "c"}]}, "prefix")
    bad(srv, {"model": "deepseek-flash"}, "missing field `messages`", 422)
    bad(srv, {"model": "deepseek-flash", "messages": [{"role": "wizard", "content": "a"}]}, "unknown variant", 422)
    bad(srv, b"{", "JSON")


@pytest.mark.parametrize(("status", "message"), [(400, "Invalid Format"), (401, "Authentication Fails"),
                                                 (402, "Insufficient Balance"), (422, "Invalid Parameters"),
                                                 (429, "Rate Limit Reached"), (500, "Server Error"),
                                                 (503, "Server Overloaded")])
def test_error_directive(mock_servers: Any, status: int, message: str) -> None:
    srv: MockServer = mock_servers("deepseek")
    resp = srv.post(PATH, ds(f"x [mock:error={status}]", stream=True))
    assert resp.status_code == status and message in resp.json()["error"]["message"]
    if status == 429:
        assert resp.headers["retry-after"] == "7"


def test_finish_reasons_and_tools(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("deepseek")
    body = srv.post(PATH, ds("x [mock:insufficient_resource]")).json()
    assert body["choices"][0]["finish_reason"] == "insufficient_system_resource"
    _, events = srv.stream(PATH, ds("x [mock:insufficient_resource]", stream=True))
    assert data(events)[-1]["choices"][0]["finish_reason"] == "insufficient_system_resource"
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    body = srv.post(PATH, ds("x [mock:tool_calls]", tools=tools)).json()
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    _, events = srv.stream(PATH, ds("x [mock:tool_calls]", tools=tools, stream=True))
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in data(events)
             if c["choices"][0]["delta"].get("tool_calls")]
    assert calls[0]["id"] and calls[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert "".join(c["function"]["arguments"] for c in calls) == '{"city": "Paris", "unit": "celsius"}'


def test_served_model_and_key(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("deepseek", api_key="sk-ds", served_model="deepseek-flash")
    resp = srv.post(PATH, ds())
    assert resp.status_code == 401 and resp.json()["error"]["type"] == "authentication_error"
    auth = {"Authorization": "Bearer sk-ds"}
    resp = srv.post(PATH, ds(model="deepseek-coder"), headers=auth)
    assert resp.status_code == 400 and resp.json()["error"]["message"] == "Model Not Exist"
    assert srv.post(PATH, ds(), headers=auth).status_code == 200
    assert [m["id"] for m in srv.client.get("/models", headers=auth).json()["data"]] == ["deepseek-flash"]
