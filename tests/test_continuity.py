"""Reasoning continuity (proxy/hub/continuity.py): the recorder fed with hub events, restore and strip on canonical
requests, the fallback for turns never seen, a store that cannot be reached, the metrics."""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any

import pytest
from prometheus_client import generate_latest

from proxy.dialects.deepseek import DeepSeekDialect
from proxy.dialects.mindie import MindIEDialect
from proxy.hub import continuity
from proxy.hub.canonical import CHAT, COMPLETIONS
from proxy.hub.events import Delta
from proxy.metrics.definitions import Metrics
from proxy.settings import UpstreamSettings, build_settings
from proxy.state import StoreUnavailable, open_store
from tests.hub_harness import request_context

# The documented placeholder for a DeepSeek tool-call turn never seen (docs/deepseek.md).
PLACEHOLDER = "(reasoning not available)"
DS = DeepSeekDialect()
REASONING = "Paris first; 先查天气 🌦 then Rome.\n"
CALLS = [
    {"id": "call_00_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
    {"id": "call_01_b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
]


def store() -> Any:
    return open_store(build_settings(config={"upstreams": [{"name": "x", "dialect": "openai",
                                                            "url": "http://127.0.0.1:9"}]}, environ={}))


class DownStore:
    """A state store that cannot be reached (the StateStore protocol, as the Redis store behaves when Redis is down)."""

    async def get(self, namespace: str, key: str) -> bytes | None:
        raise StoreUnavailable

    async def put(self, namespace: str, key: str, value: bytes, ttl: float | None = None) -> None:
        raise StoreUnavailable

    async def delete(self, namespace: str, key: str) -> bool:
        raise StoreUnavailable

    async def close(self) -> None:
        pass


def ctx(model: str = "deepseek-flash", dialect: str = "deepseek", kind: str = CHAT, **upstream: Any) -> Any:
    up = UpstreamSettings(name="ds", dialect=dialect, url="http://127.0.0.1:9", **upstream)
    return request_context(kind, model, up)


def streamed_answer(content: str = "", index: int = 0) -> list[list[Delta]]:
    """What the normalizer hands the encoder for a streamed answer with two tool calls, in several event lists."""
    return [
        [Delta(index=index, reasoning="", first=True)],
        [Delta(index=index, reasoning=REASONING[:9]), Delta(index=index, reasoning=REASONING[9:])],
        [Delta(index=index, content=content)] if content else [],
        [Delta(index=index, tool_calls=[{"index": 0, "id": "call_00_a", "type": "function",
                                         "function": {"name": "get_weather", "arguments": ""}}])],
        [Delta(index=index, tool_calls=[{"index": 0, "function": {"arguments": '{"city": '}}]),
         Delta(index=index, tool_calls=[{"index": 0, "function": {"arguments": '"Paris"}'}}])],
        [Delta(index=index, tool_calls=[{"index": 1, "id": "call_01_b", "type": "function",
                                         "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}])],
        [Delta(index=index, finish_reason="tool_calls")],
    ]


def tool_history(content: Any = None, calls: list[dict[str, Any]] | None = None, **turn: Any) -> dict[str, Any]:
    assistant = {"role": "assistant", "content": content, "tool_calls": calls or CALLS, **turn}
    return {"model": "deepseek-flash", "messages": [
        {"role": "user", "content": "Weather in Paris and Rome?"}, assistant,
        {"role": "tool", "tool_call_id": "call_00_a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_01_b", "content": "rain"},
    ]}


def counts(metrics: Metrics) -> dict[str, float]:
    out = {}
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith("dialect_proxy_reasoning_continuity_total{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('event="')[1].split('"')[0]] = float(value)
    return out


async def record(st: Any, metrics: Metrics, content: str = "") -> None:
    rec = continuity.Recorder(st, "ds", metrics)
    for events in streamed_answer(content):
        rec.feed(events)
    await rec.save()


def test_recorder_stores_the_exact_reasoning_under_every_call_id_and_restore_puts_it_back() -> None:
    async def go() -> None:
        st, metrics = store(), Metrics(None)
        await record(st, metrics)
        for call_id in ("call_00_a", "call_01_b"):
            assert await st.get("reasoning", "call:" + call_id) == REASONING.encode()
        body = tool_history()
        assert await continuity.prepare(st, DS, body, ctx(), metrics) is not None
        assert body["messages"][1]["reasoning_content"] == REASONING
        assert {k: v for k, v in body["messages"][1].items() if k != "reasoning_content"} == \
            tool_history()["messages"][1]
        assert counts(metrics) == {"recorded": 1, "restored": 1}
        # the same through DeepSeek's request builder: what the upstream gets
        sent = DS.build_request(body, ctx())
        assert sent["messages"][1]["reasoning_content"] == REASONING

    asyncio.run(go())


def test_one_known_call_id_is_enough_and_the_content_key_survives_renamed_ids() -> None:
    async def go() -> None:
        st, metrics = store(), Metrics(None)
        await record(st, metrics, content="Let me look both up.")
        one = tool_history("Let me look both up.", [CALLS[0], {**CALLS[1], "id": "call_unknown"}])
        await continuity.restore(st, one, "")
        assert one["messages"][1]["reasoning_content"] == REASONING
        # a client that renamed every id (but kept the text and the calls) still gets it, by the content key
        renamed = tool_history("Let me look both up.", [{**c, "id": f"toolu_{i}"} for i, c in enumerate(CALLS)])
        assert await continuity.restore(st, renamed, "") == (1, 0)
        assert renamed["messages"][1]["reasoning_content"] == REASONING
        # without text there is no content key: a bare call is too common to identify a turn
        bare = tool_history(None, [{**c, "id": f"toolu_{i}"} for i, c in enumerate(CALLS)])
        assert await continuity.restore(st, bare, "") == (0, 1)
        assert bare["messages"][1]["reasoning_content"] == ""  # the fallback it was given

    asyncio.run(go())


def test_a_turn_never_seen_gets_the_dialects_fallback_and_turns_with_reasoning_are_left_alone() -> None:
    async def go() -> None:
        st, metrics = store(), Metrics(None)
        body = tool_history()
        body["messages"].append({"role": "assistant", "content": "done", "tool_calls": [
            {"id": "call_x", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            "reasoning": "the client's own"})
        body["messages"].append({"role": "assistant", "content": "plain"})
        await continuity.prepare(st, DS, body, ctx(), metrics)
        assert body["messages"][1]["reasoning_content"] == PLACEHOLDER  # fixed, non-empty
        assert "reasoning_content" not in body["messages"][4] and body["messages"][4]["reasoning"] == "the client's own"
        assert "reasoning_content" not in body["messages"][5]  # no tool calls: nothing needed
        assert counts(metrics) == {"fallback": 1}
        # a dialect without a fallback leaves the turn as it is (still counted as a fallback)
        plain = tool_history()
        assert await continuity.restore(st, plain, None) == (0, 1)
        assert "reasoning_content" not in plain["messages"][1]

    asyncio.run(go())


def test_replay_modes_per_model_strip_keep_restore() -> None:
    async def go() -> None:
        st, metrics = store(), Metrics(None)
        with_reasoning = tool_history(reasoning_content="r")
        with_reasoning["messages"].append({"role": "assistant", "content": "a", "reasoning": "r2"})
        for model, dialect, setting, recorder, kept in [
            ("deepseek-flash", DS, "auto", True, True),
            ("deepseek-reasoner", DS, "auto", True, True),
            ("deepseek-chat", DS, "auto", False, True),  # non-thinking: nothing to restore, no store access
            ("DeepSeek-R1", DS, "auto", False, False),
            ("DeepSeek-R1", MindIEDialect(), "auto", False, False),
            ("qwen3-32b", MindIEDialect(), "auto", True, True),  # its template renders the tool loop's reasoning
            ("Llama-3-70B", MindIEDialect(), "auto", False, True),
            ("deepseek-flash", DS, "strip", False, False),
            ("DeepSeek-R1", DS, "keep", False, True),
            ("qwen3-32b", MindIEDialect(), "restore", True, True),
        ]:
            body = copy.deepcopy(with_reasoning)
            got = await continuity.prepare(st, dialect, body, ctx(model, dialect.name, reasoning_replay=setting),
                                           metrics)
            assert (got is not None) == recorder, (model, setting)
            assert ("reasoning_content" in body["messages"][1]) == kept, (model, setting)
            assert ("reasoning" in body["messages"][4]) == kept, (model, setting)
        # completions requests have no turns
        assert await continuity.prepare(DownStore(), DS, {"prompt": "x"}, ctx(kind=COMPLETIONS), metrics) is None

    asyncio.run(go())


def test_unreachable_store_fails_a_restore_with_503_and_only_logs_a_failed_recording(caplog: Any) -> None:
    async def go() -> None:
        metrics = Metrics(None)
        with pytest.raises(StoreUnavailable) as e:
            await continuity.prepare(DownStore(), DS, tool_history(), ctx(), metrics)
        assert e.value.status == 503 and e.value.type == "service_unavailable"
        # a request that needs no restore never touches the store
        assert await continuity.prepare(DownStore(), DS, tool_history(reasoning_content="r"), ctx(), metrics)
        with caplog.at_level(logging.WARNING, logger="dialect_proxy"):
            await record(DownStore(), metrics)
        assert "storing 2 key(s) failed" in caplog.text and REASONING not in caplog.text
        assert counts(metrics) == {"record_failed": 1}

    asyncio.run(go())


def test_each_choice_is_its_own_turn_and_answers_without_tool_calls_store_nothing() -> None:
    async def go() -> None:
        st, metrics = store(), Metrics(None)
        rec = continuity.Recorder(st, "ds", metrics)
        rec.feed([Delta(index=0, reasoning="zero"), Delta(index=1, reasoning="one")])
        rec.feed([Delta(index=1, tool_calls=[{"index": 0, "id": "call_c1", "type": "function",
                                               "function": {"name": "f", "arguments": "{}"}}])])
        rec.feed([Delta(index=0, content="no tools here", finish_reason="stop")])
        assert rec.entries() == [("call:call_c1", b"one")]
        await rec.save()
        assert await st.get("reasoning", "call:call_c1") == b"one"
        empty = continuity.Recorder(st, "ds", metrics)
        empty.feed([Delta(reasoning="thinking", content="answer")])
        await empty.save()
        assert counts(metrics) == {"recorded": 1}

    asyncio.run(go())
