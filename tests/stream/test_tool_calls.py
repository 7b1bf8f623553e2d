"""ToolCallNormalizer: whatever the upstream's tool-call deltas look like, the openai SDK accumulates the right calls.

The oracle is the SDK's own `accumulate_delta` (what `client.chat.completions.stream()` and most helpers run).
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.stream.tool_calls import ToolCallNormalizer, normalize_message_tool_calls

_deltas = pytest.importorskip("openai.lib.streaming._deltas")

CALL_ID = re.compile(r"call_[0-9a-f]{24}")


def sdk_accumulate(batches: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    acc: dict[object, object] = {}
    for batch in batches:
        if batch:
            _deltas.accumulate_delta(acc, {"tool_calls": copy.deepcopy(batch)})
    calls = acc.get("tool_calls", [])
    assert isinstance(calls, list)
    return calls


def normalize(batches: list[list[dict[str, Any]]]) -> tuple[list[list[dict[str, Any]]], ToolCallNormalizer]:
    tc = ToolCallNormalizer()
    out = [tc.feed(b) for b in batches]
    out.append(tc.flush())
    return out, tc


def summary(calls: list[dict[str, Any]]) -> list[tuple[int, str, str, str, str]]:
    return [(c["index"], c["id"], c["type"], c["function"]["name"], c["function"]["arguments"]) for c in calls]


def check_shape(batches: list[list[dict[str, Any]]]) -> None:
    """docs/decisions.md "Streams": a call's first delta = index, id, type, name; later ones = index + arguments."""
    seen: set[int] = set()
    for batch in batches:
        for d in batch:
            if d["index"] not in seen:
                seen.add(d["index"])
                assert set(d) == {"index", "id", "type", "function"} and d["type"] == "function"
                assert set(d["function"]) == {"name", "arguments"}
                assert d["index"] == len(seen) - 1  # dense, in order of first appearance
            else:
                assert set(d) == {"index", "function"} and set(d["function"]) == {"arguments"}
                assert d["function"]["arguments"]


# -- well-formed MindIE / OpenAI ------------------------------------------------------------------------------------

def test_well_formed_stream_passes_through() -> None:
    batches = [
        [{"index": 0, "id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": ""}}],
        [{"index": 0, "function": {"arguments": '{"city": '}}],
        [{"index": 0, "function": {"arguments": '"北京"}'}}],
    ]
    out, tc = normalize(batches)
    assert out[:3] == batches and out[3] == []
    check_shape(out)
    assert summary(sdk_accumulate(out)) == [(0, "call_abc", "function", "get_weather", '{"city": "北京"}')]
    assert tc.count == 1


def test_repeated_id_type_and_name_are_dropped() -> None:
    first = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{"}}
    batches = [[first], [{**first, "function": {"name": "f", "arguments": "}"}}]]
    # Without us, the SDK concatenates the repeats:
    assert summary(sdk_accumulate(batches)) == [(0, "call_1call_1", "function", "ff", "{}")]
    out, _ = normalize(batches)
    check_shape(out)
    assert summary(sdk_accumulate(out)) == [(0, "call_1", "function", "f", "{}")]


def test_parallel_calls_interleaved() -> None:
    batches = [
        [{"index": 0, "id": "a", "type": "function", "function": {"name": "f", "arguments": ""}},
         {"index": 1, "id": "b", "type": "function", "function": {"name": "g", "arguments": "[1"}}],
        [{"index": 1, "function": {"arguments": "]"}}, {"index": 0, "function": {"arguments": "{}"}}],
    ]
    out, _ = normalize(batches)
    check_shape(out)
    assert summary(sdk_accumulate(out)) == [(0, "a", "function", "f", "{}"), (1, "b", "function", "g", "[1]")]


# -- what older / other MindIE-based servers send -------------------------------------------------------------------

def test_no_index_new_id_is_a_new_call_and_no_id_continues_the_previous() -> None:
    batches = [
        [{"id": "x1", "function": {"name": "f", "arguments": '{"a"'}}],
        [{"function": {"arguments": ": 1}"}}],
        [{"id": "x2", "function": {"name": "g"}}],
        [{"function": {"arguments": "{}"}}],
    ]
    # The SDK alone refuses these outright:
    with pytest.raises(RuntimeError, match="index"):
        sdk_accumulate(batches)
    out, _ = normalize(batches)
    check_shape(out)
    assert summary(sdk_accumulate(out)) == [(0, "x1", "function", "f", '{"a": 1}'), (1, "x2", "function", "g", "{}")]


def test_known_id_without_index_continues_its_call() -> None:
    batches = [
        [{"id": "x1", "function": {"name": "f", "arguments": "1"}}],
        [{"id": "x2", "function": {"name": "g", "arguments": "2"}}],
        [{"id": "x1", "function": {"arguments": "3"}}],
    ]
    out, _ = normalize(batches)
    check_shape(out)
    assert summary(sdk_accumulate(out)) == [(0, "x1", "function", "f", "13"), (1, "x2", "function", "g", "2")]


def test_every_call_at_index_0_with_its_own_id() -> None:
    batches = [
        [{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}}],
        [{"index": 0, "id": "b", "function": {"name": "g", "arguments": "{"}}],
        [{"index": 0, "function": {"arguments": "}"}}],
    ]
    out, _ = normalize(batches)
    check_shape(out)
    assert summary(sdk_accumulate(out)) == [(0, "a", "function", "f", "{}"), (1, "b", "function", "g", "{}")]


def test_sparse_upstream_indices_become_dense() -> None:
    batches = [
        [{"index": 1, "id": "a", "type": "function", "function": {"name": "f", "arguments": "1"}}],
        [{"index": 3, "id": "b", "type": "function", "function": {"name": "g", "arguments": "2"}}],
        [{"index": 1, "function": {"arguments": "1"}}],
    ]
    # The SDK inserts index 1 into an empty list at position 0, then index 3 at position 1, then appends the
    # continuation of "index 1" to the *second* call:
    assert summary(sdk_accumulate(batches))[1][4] == "21"
    out, _ = normalize(batches)
    check_shape(out)
    assert summary(sdk_accumulate(out)) == [(0, "a", "function", "f", "11"), (1, "b", "function", "g", "2")]


def test_missing_id_is_generated_and_missing_arguments_become_empty() -> None:
    out, _ = normalize([[{"index": 0, "function": {"name": "f"}}], [{"index": 0, "function": {"arguments": "{}"}}]])
    check_shape(out)
    [call] = sdk_accumulate(out)
    assert CALL_ID.fullmatch(call["id"])
    assert call["function"] == {"name": "f", "arguments": "{}"}
    assert out[0][0]["function"]["arguments"] == ""


def test_generated_ids_differ() -> None:
    out, _ = normalize([[{"function": {"name": "f"}}, {"index": 1, "function": {"name": "g"}}]])
    ids = [d["id"] for d in out[0]]
    assert len(set(ids)) == 2 and all(CALL_ID.fullmatch(i) for i in ids)


def test_late_id_joins_the_open_call_without_repeating() -> None:
    out, _ = normalize([
        [{"index": 0, "function": {"name": "f", "arguments": "{"}}],
        [{"index": 0, "id": "call_late", "function": {"arguments": "}"}}],
    ])
    check_shape(out)
    [call] = sdk_accumulate(out)
    assert call["function"]["arguments"] == "{}" and CALL_ID.fullmatch(call["id"])


def test_object_arguments_are_serialised() -> None:
    args = {"city": "北京", "days": [1, 2], "metric": True}
    out, _ = normalize([[{"index": 0, "id": "a", "type": "function", "function": {"name": "f", "arguments": args}}]])
    check_shape(out)
    [call] = sdk_accumulate(out)
    assert isinstance(call["function"]["arguments"], str)
    assert json.loads(call["function"]["arguments"]) == args
    assert "北京" in call["function"]["arguments"]


def test_name_arriving_after_arguments_is_waited_for() -> None:
    tc = ToolCallNormalizer()
    assert tc.feed([{"index": 0, "id": "a", "function": {"arguments": '{"x"'}}]) == []
    first = tc.feed([{"index": 0, "function": {"name": "f", "arguments": ": 1}"}}])
    assert first == [{"index": 0, "id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]
    assert tc.flush() == []


def test_flush_releases_a_call_whose_name_never_came() -> None:
    tc = ToolCallNormalizer()
    assert tc.feed([{"index": 0, "id": "a", "function": {"arguments": "{}"}}]) == []
    out = [tc.flush()]
    check_shape(out)
    assert summary(sdk_accumulate(out)) == [(0, "a", "function", "", "{}")]
    assert tc.flush() == []


def test_empty_and_junk_deltas_are_dropped() -> None:
    tc = ToolCallNormalizer()
    tc.feed([{"index": 0, "id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}])
    assert tc.feed([{"index": 0, "function": {"arguments": ""}}]) == []
    assert tc.feed([{"index": 0, "type": "function", "function": {"arguments": None}}]) == []
    assert tc.feed([]) == []
    assert tc.feed(["junk", None]) == []  # type: ignore[list-item]


def test_input_is_not_mutated() -> None:
    batch = [{"id": "a", "function": {"name": "f", "arguments": {"k": 1}}}, {"function": {"arguments": "x"}}]
    before = copy.deepcopy(batch)
    ToolCallNormalizer().feed(batch)
    assert batch == before


# -- property: fragments, repeats and missing indices never corrupt what the SDK accumulates -----------------------

@st.composite
def messy_streams(draw: st.DrawFn) -> tuple[list[tuple[str, str, str]], list[list[dict[str, Any]]]]:
    calls = [
        (f"call_{i}", draw(st.sampled_from(["get_weather", "search", "f"])),
         draw(st.text(st.sampled_from('{}":, ab1北'), max_size=20)))
        for i in range(draw(st.integers(1, 3)))
    ]
    style = draw(st.sampled_from(["openai", "repeat_everything", "no_index", "index_zero", "offset_index"]))
    batches: list[list[dict[str, Any]]] = []
    for i, (cid, name, args) in enumerate(calls):
        cuts = sorted(set(draw(st.lists(st.integers(0, len(args)), max_size=5))))
        frags = [args[a:b] for a, b in zip([0, *cuts], [*cuts, len(args)], strict=True)]
        for j, frag in enumerate(frags):
            d: dict[str, Any] = {"function": {"arguments": frag}}
            if j == 0 or style == "repeat_everything":
                d["id"] = cid
                d["type"] = "function"
                d["function"]["name"] = name
            if style in ("openai", "repeat_everything"):
                d["index"] = i
            elif style == "index_zero":
                d["index"] = 0
            elif style == "offset_index":
                d["index"] = i + 5
            if batches and draw(st.booleans()):
                batches[-1].append(d)
            else:
                batches.append([d])
    return calls, batches


@settings(max_examples=300, deadline=None)
@given(messy_streams())
def test_sdk_accumulates_the_right_calls(stream: tuple[list[tuple[str, str, str]], list[list[dict[str, Any]]]]) -> None:
    calls, batches = stream
    out, _ = normalize(batches)
    check_shape(out)
    expected = [(i, cid, "function", name, args) for i, (cid, name, args) in enumerate(calls)]
    assert summary(sdk_accumulate(out)) == expected


# -- non-stream messages ---------------------------------------------------------------------------------------------

def test_message_tool_calls_empty_is_none() -> None:
    assert normalize_message_tool_calls([]) is None
    assert normalize_message_tool_calls(None) is None


def test_message_tool_calls_filled_and_stringified() -> None:
    raw = [
        {"id": "call_x", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
        {"function": {"name": "g", "arguments": {"b": [1, "二"]}}},
        {"id": "", "function": {"name": "h"}},
    ]
    before = copy.deepcopy(raw)
    out = normalize_message_tool_calls(raw)
    assert raw == before
    assert out is not None and len(out) == 3
    assert out[0] == raw[0]
    assert out[1]["type"] == "function" and CALL_ID.fullmatch(out[1]["id"])
    assert json.loads(out[1]["function"]["arguments"]) == {"b": [1, "二"]}
    assert CALL_ID.fullmatch(out[2]["id"]) and out[2]["function"] == {"name": "h", "arguments": ""}
    assert out[1]["id"] != out[2]["id"]
