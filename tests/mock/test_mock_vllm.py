"""The vLLM mock speaks as vLLM's source says its server does: chunks serialised without unset fields, the last token
on the finish chunk, the reasoning field of each release, continuous usage, its error shapes, /version and /health."""

from __future__ import annotations

import pytest
from mockutil import chat

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize(("flavour", "fields"), [("", ["reasoning"]), ("v0.15", ["reasoning", "reasoning_content"]),
                                                 ("v0.10", ["reasoning_content"])])
def test_stream_shape_of_each_release(mock_servers, flavour, fields) -> None:
    srv = mock_servers("vllm", flavour=flavour)
    resp, events = srv.stream("/v1/chat/completions", chat("Hi [mock:reasoning_field]", stream=True,
                                                           stream_options={"include_usage": True}))
    assert resp.status_code == 200 and events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all("usage" not in c for c in chunks[:-1])  # unset fields are left out, usage too
    deltas = [c["choices"][0]["delta"] for c in chunks[1:-1]]
    reasoning = [d for d in deltas if set(d) != {"content"}]
    assert reasoning and all(sorted(d) == sorted(fields) for d in reasoning)
    last = chunks[-2]["choices"][0]
    assert last["finish_reason"] == "stop" and last["delta"] == {"content": "."}  # the last token rides on it
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert ("completion_tokens_details" in chunks[-1]["usage"]) is (flavour == "")


def test_continuous_usage_and_tool_call_deltas(mock_servers) -> None:
    srv = mock_servers("vllm")
    _, events = srv.stream("/v1/chat/completions", chat(
        "Weather? [mock:tool_calls]", tools=TOOLS, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    chunks = events[:-1]
    running = [c["usage"]["completion_tokens"] for c in chunks[:-1]]
    assert running == list(range(len(running)))  # 0 on the role chunk, then one more per token
    calls = [tc for c in chunks for ch in c["choices"] for tc in ch["delta"].get("tool_calls", ())]
    head = calls[0]
    assert list(head) == ["id", "type", "index", "function"] and head["function"] == {"name": "get_weather"}
    assert head["id"].startswith("chatcmpl-tool-") and len(head["id"]) == len("chatcmpl-tool-") + 32
    assert all(list(tc) == ["index", "function"] for tc in calls[1:])
    finish = chunks[-2]["choices"][0]
    assert finish["finish_reason"] == "tool_calls" and finish["delta"]["tool_calls"][0]["function"]["arguments"]


@pytest.mark.parametrize("flavour", ["", "v0.10"])
def test_errors_and_the_unauthenticated_paths(mock_servers, flavour) -> None:
    srv = mock_servers("vllm", flavour=flavour, api_key="sk-k")
    auth = {"authorization": "Bearer sk-k"}
    refused = srv.post("/v1/chat/completions", chat("Hi"))
    assert (refused.status_code, refused.json()) == (401, {"error": "Unauthorized"})
    error = srv.post("/v1/chat/completions", chat("Hi [mock:error=500]"), headers=auth)
    info = {"message": "Mock error (mock directive error=500)", "type": "InternalServerError", "param": None,
            "code": 500}
    assert error.status_code == 500
    assert error.json() == ({"object": "error", **info} if flavour else {"error": info})
    assert srv.client.get("/health").status_code == 200 and srv.client.get("/health").content == b""
    assert srv.client.get("/version").json() == {"version": "0.10.0" if flavour else "0.20.0"}
    assert srv.client.get("/v1/models", headers=auth).json()["data"][0]["owned_by"] == "vllm"
