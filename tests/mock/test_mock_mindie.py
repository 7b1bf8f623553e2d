"""The mock MindIE Server: shapes from MindIE's documents (docs/upstreams.md), directives, validation."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from mockutil import MockServer, chat

PATH = "/v1/chat/completions"
DEFAULT = "Hello from the mock mindie upstream! 你好, 世界 🌍."


def data(events: list[Any]) -> list[dict[str, Any]]:
    return [e for e in events if isinstance(e, dict)]


def contents(events: list[Any]) -> list[str]:
    return [c["delta"].get("content") for e in data(events) for c in e["choices"]]


def test_non_stream_shape(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("mindie")
    body = srv.post(PATH, chat("hi", model="qwen")).json()
    assert body["id"].startswith("endpoint_common_") and body["object"] == "chat.completion"
    assert body["model"] == "qwen" and isinstance(body["created"], int)
    assert "system_fingerprint" not in body
    (choice,) = body["choices"]
    assert choice == {"index": 0, "message": {"role": "assistant", "content": DEFAULT, "tool_calls": []},
                      "logprobs": None, "finish_reason": "stop"}
    usage = body["usage"]
    n = usage["completion_tokens"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + n
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    assert usage["batch_size"] == [1] * n and len(usage["queue_wait_time"]) == n
    assert isinstance(body["prefill_time"], int) and len(body["decode_time_arr"]) == n - 1


def test_req_id_header_becomes_the_id(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("mindie")
    assert srv.post(PATH, chat(), headers={"req-id": "abc-1"}).json()["id"] == "abc-1"
    _, events = srv.stream(PATH, chat(stream=True), headers={"req-id": "abc-2"})
    assert {e["id"] for e in data(events)} == {"abc-2"}


@pytest.mark.parametrize("include_usage", [None, True, False])
def test_stream_shape(mock_servers: Any, include_usage: bool | None) -> None:
    srv: MockServer = mock_servers("mindie")
    extra = {} if include_usage is None else {"stream_options": {"include_usage": include_usage}}
    resp, events = srv.stream(PATH, chat(stream=True, **extra))
    assert resp.status_code == 200 and events[-1] == "[DONE]"
    chunks = data(events)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    for chunk in chunks:
        assert chunk["object"] == "chat.completion.chunk" and chunk["id"] == chunks[0]["id"]
        assert chunk["choices"][0]["delta"]["role"] == "assistant"  # repeated on every delta
    # one chunk per token; the last token's chunk carries finish_reason and usage, whatever stream_options says
    assert all(c["choices"][0]["finish_reason"] is None and "usage" not in c for c in chunks[:-1])
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "stop" and last["choices"][0]["delta"]["content"] == "."
    assert last["usage"]["completion_tokens"] == len(chunks) - 1 == 13
    assert list(last) == ["id", "object", "created", "model", "usage", "choices"]
    assert "".join(contents(events)) == DEFAULT
    # the emoji is split over two byte-level tokens: the first decodes to nothing yet
    assert "" in contents(events)[1:] and " 🌍" in contents(events)


def test_full_text_stream(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("mindie", full_text=True)
    _, events = srv.stream(PATH, chat(stream=True))
    snapshots = contents(events)
    assert snapshots[0] == ""
    for before, after in itertools.pairwise(snapshots):
        assert after.startswith(before)  # cumulative, never a half-decoded character by default
    assert all("\ufffd" not in s for s in snapshots)
    assert snapshots[-1] == DEFAULT and data(events)[-1]["full_text"] == DEFAULT
    assert snapshots.count(snapshots[-3]) == 2  # the held-back token repeats the previous snapshot


def test_full_text_split_utf8(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("mindie", full_text=True)
    _, events = srv.stream(PATH, chat("x [mock:split_utf8]", stream=True))
    snapshots = contents(events)
    i = next(i for i, s in enumerate(snapshots) if s.endswith("\ufffd"))
    assert snapshots[i + 1] == snapshots[i][:-1] + "🌍"
    assert snapshots[-1] == DEFAULT


def test_full_text_split_utf8_end(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("mindie", full_text=True)
    _, events = srv.stream(PATH, chat("x [mock:split_utf8_end]", stream=True))
    last = data(events)[-1]
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["choices"][0]["delta"]["content"].endswith("\ufffd") and last["full_text"].endswith("\ufffd")


def test_delta_split_utf8_end(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("mindie")
    _, events = srv.stream(PATH, chat("x [mock:split_utf8_end]", stream=True))
    assert contents(events)[-1] == " \ufffd"
    assert srv.post(PATH, chat("x [mock:split_utf8_end]")).json()["choices"][0]["message"]["content"] \
        .endswith("世界 \ufffd")


def test_full_text_rewrite(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("mindie", full_text=True)
    _, events = srv.stream(PATH, chat("x [mock:rewrite]", stream=True))
    assert contents(events) == ["", "Hello", "Hello wor", "Hello, world", "Hello, world!"]
    plain: MockServer = mock_servers("mindie")
    _, events = plain.stream(PATH, chat("x [mock:rewrite]", stream=True))
    assert "".join(contents(events)) == "Hello, world!"


def test_chunks_and_max_tokens(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("mindie")
    _, events = srv.stream(PATH, chat("x [mock:chunks=5]", stream=True))
    assert contents(events) == ["", "tok0", " tok1", " tok2", " tok3", " tok4"]
    body = srv.post(PATH, chat("x [mock:chunks=5]", max_tokens=3)).json()
    assert body["choices"][0]["message"]["content"] == "tok0 tok1 tok2"
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 3
    # maxIterTimes = 512 caps generation when max_tokens is absent
    body = srv.post(PATH, chat("x [mock:chunks=600]")).json()
    assert body["usage"]["completion_tokens"] == 512 and body["choices"][0]["finish_reason"] == "length"


def test_think_inline(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("mindie")
    content = srv.post(PATH, chat("x [mock:think]")).json()["choices"][0]["message"]["content"]
    assert content.startswith("<think>") and "</think>\n\n" + DEFAULT in content
    content = srv.post(PATH, chat("x [mock:think_close_only]")).json()["choices"][0]["message"]["content"]
    assert "<think>" not in content and content.index("</think>\n\n") > 0 and content.endswith(DEFAULT)
    body = srv.post(PATH, chat("x [mock:think_unclosed]")).json()
    assert body["choices"][0]["message"]["content"].startswith("<think>")
    assert "</think>" not in body["choices"][0]["message"]["content"]
    assert body["choices"][0]["finish_reason"] == "length"
    _, events = srv.stream(PATH, chat("x [mock:think,split_tags]", stream=True))
    assert contents(events)[1:3] == ["<th", "ink>"]


def test_reasoning_field(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("mindie")
    body = srv.post(PATH, chat("x [mock:reasoning_field]")).json()
    message = body["choices"][0]["message"]
    assert message["content"] == DEFAULT and message["reasoning_content"].startswith("The user")
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
    _, events = srv.stream(PATH, chat("x [mock:reasoning_field]", stream=True))
    deltas = [c["delta"] for e in data(events) for c in e["choices"]]
    reasoning = [d for d in deltas if "reasoning_content" in d]
    assert reasoning and all("content" not in d and d["role"] == "assistant" for d in reasoning)


def test_tool_calls(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("mindie")
    tools = [{"type": "function", "function": {"name": "get_delivery_date", "parameters": {"type": "object"}}}]
    body = srv.post(PATH, chat("x [mock:tool_calls]", tools=tools)).json()
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == ""
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "get_delivery_date"
    assert call["id"].startswith("call_") and len(call["id"]) == 13
    assert call["function"]["arguments"] == '{"city": "Paris", "unit": "celsius"}'

    _, events = srv.stream(PATH, chat("x [mock:tool_calls]", tools=tools, stream=True))
    deltas = [c["delta"] for e in data(events) for c in e["choices"]][1:]
    first = deltas[0]["tool_calls"][0]
    assert first == {"index": 0, "id": first["id"], "type": "function", "function": {"name": "get_delivery_date"}}
    assert all(set(d["tool_calls"][0]) == {"index", "function"} for d in deltas[1:])
    assert "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas[1:]) == call["function"]["arguments"]
    assert data(events)[-1]["choices"][0]["finish_reason"] == "tool_calls"

    _, events = srv.stream(PATH, chat("x [mock:tool_calls_noindex]", tools=tools, stream=True))
    calls = [c["delta"]["tool_calls"][0] for e in data(events) for c in e["choices"] if "tool_calls" in c["delta"]]
    assert calls and all("index" not in c for c in calls)

    body = srv.post(PATH, chat("x [mock:tool_calls=2]", tools=tools)).json()
    assert len(body["choices"][0]["message"]["tool_calls"]) == 2


def test_raw_timeout(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("mindie")
    resp, events = srv.stream(PATH, chat("x [mock:raw_timeout]", stream=True))
    assert resp.status_code == 200
    assert resp.text.endswith("Engine callback timeout: server tokenTimeout")
    assert events[-1] == ("raw", "Engine callback timeout: server tokenTimeout") and "[DONE]" not in events
    assert all(c["finish_reason"] is None for e in data(events) for c in e["choices"])
    resp = srv.post(PATH, chat("x [mock:raw_timeout]"))
    assert resp.status_code == 500
    assert resp.json() == {"error": "Engine callback timeout: server tokenTimeout",
                           "error_type": "Incomplete Generation"}


def test_bad_json_and_no_finish(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("mindie")
    _, events = srv.stream(PATH, chat("x [mock:bad_json]", stream=True))
    assert any(isinstance(e, tuple) and e[0] == "bad" for e in events) and events[-1] == "[DONE]"
    _, events = srv.stream(PATH, chat("x [mock:no_finish]", stream=True))
    assert events[-1] == "[DONE]"
    assert all(c["finish_reason"] is None for e in data(events) for c in e["choices"])


def test_n_choices_come_in_their_own_chunks(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("mindie")
    _, events = srv.stream(PATH, chat("x [mock:chunks=3]", stream=True, n=2, temperature=0.7))
    chunks = data(events)
    assert all(len(c["choices"]) == 1 for c in chunks)
    assert [c["choices"][0]["index"] for c in chunks] == [0, 1] * 4
    finished = [c for c in chunks if c["choices"][0]["finish_reason"]]
    assert len(finished) == 2 and all(c["usage"]["completion_tokens"] == 3 for c in finished)
    body = srv.post(PATH, chat("x", n=2, temperature=0.7)).json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert len(data(srv.stream(PATH, chat("x [mock:n=2]", stream=True))[1])) == 2 * 14


@pytest.mark.parametrize("status", [400, 404, 422, 424, 500])
def test_error_directive(mock_servers: Any, status: int) -> None:
    srv: MockServer = mock_servers("mindie")
    for stream in (False, True):
        resp = srv.post(PATH, chat(f"x [mock:error={status}]", stream=stream))
        assert resp.status_code == status
        assert resp.headers["content-type"] == "application/json"
        body = resp.json()
        assert set(body) == {"error", "error_type"} and isinstance(body["error"], str)
    expected = {422: "Input Validation Error", 424: "Generation Error", 500: "Incomplete Generation",
                404: "NotFoundError"}
    if status in expected:
        assert body["error_type"] == expected[status]


def test_special_errors(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("mindie")
    resp = srv.post(PATH, chat("x [mock:error=503]", stream=True))
    assert resp.status_code == 503 and resp.content == b""
    resp = srv.post(PATH, chat("x [mock:error=413]"))
    assert resp.status_code == 413
    assert resp.json() == {"message": "Request body too large. Maximum allowed size is 40MB."}
    resp = srv.post(PATH, chat("x [mock:error=raw500]"))
    assert resp.status_code == 500 and resp.text == "Server internal error"


def invalid(srv: MockServer, body: Any, fragment: str, path: str = PATH) -> None:
    resp = srv.post(path, body)
    assert resp.status_code == 422, resp.text
    err = resp.json()
    assert err["error_type"] == "Input Validation Error" and fragment in err["error"], err


@pytest.mark.parametrize(("extra", "fragment"), [
    ({"temperature": 2.5}, "temperature must be in"),
    ({"temperature": -0.1}, "temperature must be in"),
    ({"top_p": 0}, "top_p must be in (0.0,1.0]"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": 0}, "top_k must be in -1"),
    ({"max_tokens": 0}, "max_tokens must be (0,2147483647]"),
    ({"max_tokens": 2**31}, "max_tokens must be"),
    ({"max_tokens": 1.5}, "max_tokens not number_integer"),
    ({"stop": ["s"] * 1025}, "`stop` must be list[string]"),
    ({"stop": ""}, "length of `stop`"),
    ({"stop": 5}, "param stop must be string or list[string]"),
    ({"tool_choice": "sometimes"}, "tool_choice string not in [none, auto, required]"),
    ({"tool_choice": 3}, "tool_choice not string or object"),
    ({"tools": [{"type": "retrieval"}]}, "Tool param not function type"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"n": 2}, "best_of/n can not greater than 1"),
    ({"logprobs": False, "top_logprobs": 2}, "logprobs must be true or null"),
    ({"top_logprobs": 21}, "top logprobs must be in [0, 20]"),
    ({"stream": "yes"}, "stream"),
])
def test_parameter_validation(mock_servers: Any, extra: dict[str, Any], fragment: str) -> None:
    srv: MockServer = mock_servers("mindie")
    invalid(srv, chat("x", **extra), fragment)
    invalid(srv, chat("x", **{"stream": True, **extra}), fragment)  # validated before any SSE


def test_message_validation(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("mindie")
    tools = [{"type": "function", "function": {"name": "f"}}]
    invalid(srv, b"{oops", "JSON")
    invalid(srv, {"messages": [{"role": "user", "content": "x"}]}, "Request contains not model or model null")
    invalid(srv, {"model": "m"}, "Request param contains not messages or messages null")
    invalid(srv, {"model": "m", "messages": []}, "messages not arr or arr is empty")
    invalid(srv, {"model": "m", "messages": [{"content": "x"}]}, "contains not role")
    invalid(srv, {"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "role must be system")
    invalid(srv, {"model": "m", "messages": [{"role": "developer", "content": "x"}], "tools": tools},
            "role must be system")
    invalid(srv, {"model": "m", "messages": [{"role": "user"}]}, "contains not content")
    invalid(srv, {"model": "m", "messages": [{"role": "assistant", "content": ""}]}, "should not be empty")
    invalid(srv, {"model": "m", "messages": [{"role": "tool", "content": "r"}]}, "tool_call_id")
    invalid(srv, {"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"id": "1", "type": "function",
                                                                                  "function": {"name": "f"}}]}]},
            "contains no function arguments")
    # accepted: developer without tools, assistant with tool_calls and no content, list content
    ok = {"model": "m", "messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                              "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "result", "tool_call_id": "c1"},
        {"role": "user", "content": "thanks"}]}
    assert srv.post(PATH, ok).status_code == 200
    assert srv.post(PATH, chat("x", top_k=-1, temperature=0, stop=["a", "b"], max_tokens=2**31 - 1,
                               tool_choice={"type": "function", "function": {"name": "f"}})).status_code == 200


def test_served_model_and_api_key(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("mindie", served_model="qwen", api_key="secret")
    auth = {"Authorization": "Bearer secret"}
    resp = srv.post(PATH, chat(model="other"), headers=auth)
    assert resp.status_code == 422 and resp.json() == {"error": "Model not found",
                                                       "error_type": "Input Validation Error"}
    resp = srv.post("/v1/completions", {"model": "other", "prompt": "x"}, headers=auth)
    assert resp.status_code == 422 and "Not found given model" in resp.json()["error"]
    assert srv.post(PATH, chat(model="qwen"), headers=auth).status_code == 200
    resp = srv.post(PATH, chat(model="qwen"))
    assert resp.status_code == 401 and set(resp.json()) == {"error", "error_type"}
    assert srv.client.get("/v1/models", headers=auth).json()["data"][0]["id"] == "qwen"
    assert srv.client.get("/v1/models/qwen", headers=auth).status_code == 200
    assert srv.client.get("/v1/models").status_code == 401


@pytest.mark.parametrize("full_text", [False, True])
def test_completions(mock_servers: Any, full_text: bool) -> None:
    srv: MockServer = mock_servers("mindie", full_text=full_text)
    body = srv.post("/v1/completions", {"model": "m", "prompt": "Once [mock:chunks=4]"}).json()
    assert body["object"] == "text_completion" and body["id"].startswith("endpoint_common_")
    assert body["choices"][0]["text"] == "tok0 tok1 tok2 tok3" and body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == 4
    _, events = srv.stream("/v1/completions", {"model": "m", "prompt": "Once [mock:chunks=4]", "stream": True})
    texts = [e["choices"][0]["text"] for e in data(events)]
    if full_text:
        assert texts == ["tok0", "tok0 tok1", "tok0 tok1 tok2", "tok0 tok1 tok2 tok3"]
    else:
        assert texts == ["tok0", " tok1", " tok2", " tok3"]
    assert data(events)[-1]["choices"][0]["finish_reason"] == "stop" and "usage" in data(events)[-1]
    assert events[-1] == "[DONE]"
    invalid(srv, {"model": "m"}, "Contains not prompt or prompt null", "/v1/completions")
    invalid(srv, {"model": "m", "prompt": 5}, "The type of prompt is abnormal", "/v1/completions")
    invalid(srv, {"model": "m", "prompt": "x", "logprobs": 6}, "logprobs should be in range [0, 5]",
            "/v1/completions")


def test_v2_health(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("mindie")
    assert srv.client.get("/v2/health/live").status_code == 200
    assert srv.client.get("/v2/health/ready").status_code == 200
