"""The Responses encoder over the real pipeline, in-process: upstream bytes -> upstream session -> normaliser ->
ResponsesEncoder -> the events a Responses client parses. Cutting the upstream bytes anywhere gives the same answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hub_harness import drive
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.clients.responses_events import Echo, ResponsesEncoder, responses_consumer
from proxy.clients.responses_request import ToolName, to_chat
from proxy.clients.signature import ThinkingSigner
from proxy.dialects import get_dialect
from proxy.hub.canonical import CHAT, RequestContext
from proxy.hub.events import Answer, Delta
from proxy.hub.pipeline import Pipeline
from proxy.settings import UpstreamSettings

FIXTURES = Path(__file__).parent.parent / "fixtures"


def chunk(delta: dict[str, Any], finish: str | None = None, usage: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"id": "u", "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage:
        out["usage"] = usage
    return out


def sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


# inline <think> split over chunks, text, then a function call and a freeform (custom) call in fragments
OPENAI_STREAM = sse(
    chunk({"role": "assistant", "content": "<th"}), chunk({"content": "ink>Let me "}), chunk({"content": "think"}),
    chunk({"content": "</thi"}), chunk({"content": "nk>\n\nCalling 🌍 tools."}),
    chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                           "function": {"name": "get_weather", "arguments": '{"ci'}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}]}),
    chunk({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                           "function": {"name": "apply_patch", "arguments": '{"input": "*** Begin'}}]}),
    chunk({"tool_calls": [{"index": 1, "function": {"arguments": ' Patch\\n"}'}}]}),
    chunk({}, "tool_calls", {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16,
                             "prompt_tokens_details": {"cached_tokens": 4},
                             "completion_tokens_details": {"reasoning_tokens": 3}}),
)
TOOLS = {"get_weather": ToolName("get_weather"), "apply_patch": ToolName("apply_patch", custom=True)}


def context(dialect: str, **up: Any) -> RequestContext:
    upstream = UpstreamSettings(name="u", dialect=dialect, url="http://127.0.0.1:9", **up)
    return RequestContext(kind=CHAT, request_id="r", client_model="m", upstream_model="m", upstream=upstream,
                          stream=True, response_id="resp_0123456789abcdef", created=7)


def run(pieces: list[bytes], dialect: str, stream: bool = True, **up: Any) -> bytes:
    ctx = context(dialect, **up)
    answer = Answer()
    session = get_dialect(dialect).session(ctx)
    pipeline = Pipeline(session, answer)
    encoder = ResponsesEncoder(ctx, answer, responses_consumer(stream), Echo({"store": False}), TOOLS,
                               ThinkingSigner(b"k"))
    return drive(pieces, pipeline, encoder, stream)


def parse(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in raw.decode().split("\n\n"):
        if block.strip():
            name, data = block.split("\n", 1)
            out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def summary(events: list[tuple[str, dict[str, Any]]]) -> tuple[list[str], dict[str, str], dict[str, Any]]:
    """What must not depend on where the bytes were cut: the event names with runs of deltas merged, the text
    streamed per item, and the final response."""
    names: list[str] = []
    streamed: dict[str, str] = {}
    for name, data in events:
        if name.endswith(".delta"):
            streamed[data["item_id"]] = streamed.get(data["item_id"], "") + data["delta"]
            if names and names[-1] == name:
                continue
        names.append(name)
    final = dict(events[-1][1]["response"])
    # The clock at the end of the answer: the one field that depends on when the test ran.
    completed_at = final.pop("completed_at")
    assert completed_at is None or completed_at >= final["created_at"]
    return names, streamed, final


def test_items_in_order_with_their_done_events() -> None:
    events = parse(run([OPENAI_STREAM], "openai"))
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    names, streamed, final = summary(events)
    assert [i["type"] for i in final["output"]] == ["reasoning", "message", "function_call", "custom_tool_call"]
    reasoning, message, function, custom = final["output"]
    assert reasoning["content"][0]["text"] == "Let me think" and streamed[reasoning["id"]] == "Let me think"
    assert message["content"][0]["text"] == "Calling 🌍 tools." == streamed[message["id"]]
    assert function == {"id": function["id"], "type": "function_call", "status": "completed", "call_id": "call_a",
                        "name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert custom["input"] == "*** Begin Patch\n" and custom["call_id"] == "call_b"
    assert streamed[custom["id"]] == "*** Begin Patch\n"
    assert final["usage"] == {"input_tokens": 9, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 7,
                              "output_tokens_details": {"reasoning_tokens": 3}, "total_tokens": 16}
    assert names == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_text.delta", "response.reasoning_text.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta", "response.output_item.added",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.custom_tool_call_input.delta", "response.custom_tool_call_input.done", "response.output_item.done",
        "response.completed",
    ]
    # the reasoning is sealed: the same signer opens it
    assert ThinkingSigner(b"k").open("", reasoning["encrypted_content"]) == ("Let me think", True)


def test_non_stream_is_the_same_response() -> None:
    streamed = summary(parse(run([OPENAI_STREAM], "openai")))[2]
    folded = json.loads(run([OPENAI_STREAM], "openai", stream=False))
    assert folded.pop("completed_at") >= folded["created_at"]
    assert folded == streamed


def cuts(raw: bytes, points: list[int]) -> list[bytes]:
    marks = sorted({p % (len(raw) + 1) for p in points})
    return [raw[a:b] for a, b in zip([0, *marks], [*marks, len(raw)], strict=True)]


STREAMS = [
    (OPENAI_STREAM, "openai", {}),
    ((FIXTURES / "mindie" / "stream-fulltext.sse").read_bytes(), "mindie", {"full_text": True}),
    ((FIXTURES / "deepseek" / "reasoner-stream.sse").read_bytes(), "deepseek", {}),
    ((FIXTURES / "engine" / "chat-tool-stream.sse").read_bytes(), "engine", {}),
]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(range(len(STREAMS))), st.lists(st.integers(0, 100_000), max_size=25))
def test_cutting_the_upstream_bytes_anywhere_gives_the_same_events(which: int, points: list[int]) -> None:
    raw, dialect, up = STREAMS[which]
    whole = summary(parse(run([raw], dialect, **up)))
    assert summary(parse(run(cuts(raw, points), dialect, **up))) == whole


def test_request_mapping() -> None:
    signer = ThinkingSigner(b"k")
    body = {
        "model": "m", "instructions": "sys", "stream": True, "max_output_tokens": 50, "reasoning": {"effort": "high"},
        "input": [
            {"role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": "data:image/png;base64,AA==", "detail": "low"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": signer.sign_text("why", True)},
            {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "custom_tool_call", "id": "ctc_1", "call_id": "c2", "name": "apply_patch", "input": "P"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "custom_tool_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "done"}]},
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        ],
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": True},
                  {"type": "custom", "name": "apply_patch", "format": {"type": "grammar", "syntax": "lark",
                                                                       "definition": "start: /.+/"}},
                  {"type": "web_search"}],
        "tool_choice": {"type": "custom", "name": "apply_patch"},
    }
    decoded = to_chat(body, [], signer)
    req = decoded.request
    assert req["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "system", "content": "dev"},
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA==",
                                                                         "detail": "low"}}]},
        {"role": "assistant", "content": None, "reasoning_content": "why", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "apply_patch", "arguments": '{"input":"P"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "done"},
    ]
    assert req["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}
    assert [t["function"]["name"] for t in req["tools"]] == ["get_weather", "apply_patch"]
    assert "lark grammar" in req["tools"][1]["function"]["description"]
    assert req["max_tokens"] == 50 and req["reasoning_effort"] == "high"
    assert req["stream_options"] == {"include_usage": True}
    assert decoded.ignored_tools == ["web_search"] and decoded.tools["apply_patch"].custom


def test_output_item_ids_are_distinct_and_numbered_in_output_order() -> None:
    """Each output item's id is its kind, the response's id and its place in the output (two digits at least):
    distinct within the response, and readable in order past the ninth item."""
    ctx = context("openai")
    encoder = ResponsesEncoder(ctx, Answer(), responses_consumer(False), Echo({}), {}, None)
    calls = [{"index": i, "id": f"call_{i}", "function": {"name": "get", "arguments": "{}"}} for i in range(11)]
    encoder.feed([Delta(reasoning="Hmm"), Delta(content="Calling."),
                  Delta(tool_calls=calls, finish_reason="tool_calls")])
    (whole,) = encoder.finish()
    ids = [item["id"] for item in json.loads(whole.data)["output"]]
    assert ids == ["rs_0123456789abcdef00", "msg_0123456789abcdef01",
                   *[f"fc_0123456789abcdef{n:02d}" for n in range(2, 13)]]


def test_echo_fills_what_the_response_object_requires() -> None:
    """Open Responses' ResponseResource requires these: the request's values, else OpenAI's defaults (null where
    nothing was asked: no invented cap, key or strictness)."""
    bare = Echo({"tools": [{"type": "function", "name": "f"}, {"type": "custom", "name": "g"}]})
    assert bare.tools == [{"type": "function", "name": "f", "description": None, "parameters": None, "strict": None},
                          {"type": "custom", "name": "g"}]
    assert (bare.presence_penalty, bare.frequency_penalty, bare.top_logprobs) == (0.0, 0.0, 0)
    assert bare.max_tool_calls is None
    assert (bare.service_tier, bare.safety_identifier, bare.prompt_cache_key) == ("default", None, None)
    asked = Echo({"tools": [{"type": "function", "name": "f", "strict": True, "parameters": {"type": "object"}}],
                  "presence_penalty": 0.5, "top_logprobs": 3, "max_tool_calls": 2, "service_tier": "flex",
                  "safety_identifier": "u1", "prompt_cache_key": "k"})
    assert asked.tools[0]["strict"] is True and asked.tools[0]["parameters"] == {"type": "object"}
    assert (asked.presence_penalty, asked.top_logprobs, asked.max_tool_calls) == (0.5, 3, 2)
    assert (asked.service_tier, asked.safety_identifier, asked.prompt_cache_key) == ("flex", "u1", "k")
    assert Echo({"service_tier": "auto"}).service_tier == "default"


USAGE_WITHOUT_REASONING_COUNT = {"prompt_tokens": 9, "completion_tokens": 40, "total_tokens": 49}


@pytest.mark.parametrize("stream", [True, False])
def test_reasoning_tokens_the_upstream_did_not_count_are_not_zero(stream: bool) -> None:
    """The schemas (OpenAI's and Open Responses') require `output_tokens_details.reasoning_tokens`, an integer: where
    the upstream gave no count, the reasoning's estimated tokens (never more than the output's), not 0; an answer
    without reasoning has 0."""
    thought = sse(chunk({"role": "assistant", "content": "<think>Let me think about 你好</think>\n\nHi."}),
                  chunk({}, "stop", USAGE_WITHOUT_REASONING_COUNT))
    plain = sse(chunk({"role": "assistant", "content": "Hi."}), chunk({}, "stop", USAGE_WITHOUT_REASONING_COUNT))

    def usage(raw: bytes) -> dict[str, Any]:
        body = run([raw], "openai", stream=stream)
        response = parse(body)[-1][1]["response"] if stream else json.loads(body)
        result: dict[str, Any] = response["usage"]
        return result

    # "Let me think about " 19 ASCII characters (5 tokens by the estimate) and two CJK characters (2)
    assert usage(thought)["output_tokens_details"] == {"reasoning_tokens": 7}
    assert usage(plain)["output_tokens_details"] == {"reasoning_tokens": 0}
    tiny = sse(chunk({"role": "assistant", "content": "<think>" + "x" * 400 + "</think>Hi."}),
               chunk({}, "stop", {"prompt_tokens": 9, "completion_tokens": 12, "total_tokens": 21}))
    assert usage(tiny)["output_tokens_details"] == {"reasoning_tokens": 12}  # at most the output's count
