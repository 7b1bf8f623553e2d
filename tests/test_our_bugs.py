"""A bug of ours is ours: an exception raised inside the translation (here, an upstream session's `chunk`) reaches the
client as a 500 `internal_error` in its own dialect's error shape (or, after the stream head, as the in-stream error
event), is counted under that code and logged with its traceback; it is never blamed on the upstream. Malformed
upstream data stays a 502 that names the field (tests/hostile/test_hostile_upstreams.py; here through the hub)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from proxy.build import BUILD
from proxy.dialects import get_dialect
from proxy.dialects.base import UpstreamSession
from proxy.errors import MalformedUpstream, StreamTruncated
from proxy.settings import UpstreamSettings
from tests.conftest import Mock
from tests.hub_harness import complete, relay, request_context
from tests.test_gateway import metric

# A compiled class's method cannot be replaced from Python (setup.py lists proxy/dialects/base.py): the in-process
# bug is planted in the pure build only; the compiled build runs the malformed-data tests below.
plants_bugs = pytest.mark.skipif(BUILD == "mypyc", reason="a compiled UpstreamSession.chunk cannot be replaced")
CHAT = "/v1/chat/completions"


@pytest.fixture
def proxy_log() -> Iterator[list[str]]:
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(logging.Formatter().format(record))  # with the traceback, as the proxy's log has it

    logger = logging.getLogger("dialect_proxy")
    handler, level = Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield lines
    logger.removeHandler(handler)
    logger.setLevel(level)


def plant_bug(monkeypatch: pytest.MonkeyPatch, after: int = 0) -> None:
    """UpstreamSession.chunk answers its first `after` events as usual, then trips over a bug of ours."""
    real = UpstreamSession.chunk
    calls = [0]

    def chunk(self: UpstreamSession, data: Any, whole: bool = False) -> Any:
        calls[0] += 1
        if calls[0] > after:
            return _translate_with_a_bug(data)
        return real(self, data, whole)

    monkeypatch.setattr(UpstreamSession, "chunk", chunk)


def _translate_with_a_bug(data: Any) -> Any:
    return {}["a key our own code forgot"]


def body(stream: bool, text: str = "hello") -> dict[str, Any]:
    return {"model": "m", "stream": stream, "messages": [{"role": "user", "content": text}]}


@plants_bugs
def test_a_bug_in_chunk_is_a_500_internal_error_with_its_traceback_logged(
    start_mock: Callable[..., Mock], start_proxy: Callable[..., Any], proxy_log: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proxy = start_proxy(mock=start_mock("openai"), models=["m"])
    plant_bug(monkeypatch)
    for stream in (False, True):
        resp = httpx.post(proxy.url + CHAT, json=body(stream), timeout=20)
        err = resp.json()["error"]
        assert resp.status_code == 500, resp.text
        assert (err["type"], err["code"]) == ("server_error", "internal_error")
        assert "upstream" not in err["message"].lower()
    log = "\n".join(proxy_log)
    assert "Traceback (most recent call last)" in log and "_translate_with_a_bug" in log and "KeyError" in log
    assert "unexpected shape" not in log
    assert metric(proxy, "dialect_proxy_errors_total", code="internal_error") == 2
    assert metric(proxy, "dialect_proxy_errors_total", code="bad_gateway") == 0


@plants_bugs
def test_a_bug_reaches_a_messages_client_in_anthropics_error_shape(
    start_mock: Callable[..., Mock], start_proxy: Callable[..., Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    proxy = start_proxy(mock=start_mock("openai"), models=["m"])
    plant_bug(monkeypatch)
    resp = httpx.post(proxy.url + "/v1/messages", json={**body(False), "max_tokens": 50}, timeout=20)
    assert resp.status_code == 500, resp.text
    data = resp.json()
    assert data["type"] == "error" and data["error"]["type"] == "api_error"
    assert "upstream" not in data["error"]["message"].lower()


@plants_bugs
def test_a_bug_after_the_stream_head_ends_the_stream_with_internal_error(
    start_mock: Callable[..., Mock], start_proxy: Callable[..., Any], proxy_log: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proxy = start_proxy(mock=start_mock("openai"), models=["m"])
    plant_bug(monkeypatch, after=3)  # the role chunk and two tokens go through: the head is committed
    text = "[mock:chunks=20][mock:delay_ms=30] hello"
    with httpx.stream("POST", proxy.url + CHAT, json=body(True, text), timeout=20) as resp:
        status = resp.status_code
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert status == 200
    assert any(json.loads(e).get("choices") for e in events[:-1])  # some of the answer came first
    assert events[-1] != "[DONE]"
    err = json.loads(events[-1])["error"]
    assert err["code"] == "internal_error" and "upstream" not in err["message"].lower()
    assert "Traceback (most recent call last)" in "\n".join(proxy_log)
    assert metric(proxy, "dialect_proxy_errors_total", code="internal_error") == 1


# -- malformed upstream data: the upstream's fault, a 502 naming the field -------------------------------------------

UP = UpstreamSettings(name="u", dialect="openai", url="http://127.0.0.1:9")


@pytest.mark.parametrize(("answer", "field"), [
    ({"choices": [{"index": "0", "message": {"content": "hi"}}]}, "choices[0].index"),
    ({"choices": [{"index": 0, "message": {"content": 7}, "finish_reason": "stop"}]}, "choices[0].delta.content"),
    ({"choices": [{"index": 0, "message": {"tool_calls": {}}, "finish_reason": "stop"}]},
     "choices[0].delta.tool_calls"),
    ({"choices": [{"index": 0, "message": {}, "finish_reason": ["stop"]}]}, "choices[0].finish_reason"),
])
def test_a_malformed_answer_is_a_502_naming_the_field(answer: dict[str, Any], field: str) -> None:
    ctx = request_context("chat", "m", UP)
    with pytest.raises(MalformedUpstream) as caught:
        complete(answer, ctx, get_dialect("openai"))
    assert caught.value.status == 502 and caught.value.code == "bad_gateway"
    assert f"`{field}`" in caught.value.message


@pytest.mark.parametrize(("event", "field"), [
    (b'{"choices": [{"index": 0, "delta": "hi"}]}', "choices[0].delta"),
    (b'{"choices": [{"index": 0, "delta": {"reasoning_content": {"t": 1}}}]}', "choices[0].delta.reasoning_content"),
    (b'{"choices": 5}', "choices"),
    (b'{"choices": ["x"]}', "choices[0]"),
])
def test_a_malformed_stream_event_is_an_invalid_data_truncation_naming_the_field(event: bytes, field: str) -> None:
    ctx = request_context("chat", "m", UP, stream=True)
    good = b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n'
    with pytest.raises(StreamTruncated) as caught:
        relay([good, b"data: " + event + b"\n\n"], ctx, get_dialect("openai"))
    assert caught.value.reason == "invalid_data" and caught.value.status == 502
    assert f"`{field}`" in caught.value.message


def test_a_completions_text_that_is_not_a_string_is_named() -> None:
    ctx = request_context("completions", "m", UP)
    with pytest.raises(MalformedUpstream) as caught:
        complete({"choices": [{"index": 0, "text": ["a"], "finish_reason": "stop"}]}, ctx, get_dialect("openai"))
    assert "`choices[0].text`" in caught.value.message
