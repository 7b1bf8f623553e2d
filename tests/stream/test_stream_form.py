"""A stream of the other form than `full_text` says is never passed on (proxy/stream/cumulative.py StreamForm,
proxy/dialects/mindie.py, proxy/hub/pipeline.py): the mock with fullTextEnabled in front of a proxy without
`full_text`, and the reverse. The stream's first texts are held back until their form is known, so the client gets
an HTTP 502 `full_text_mismatch` that names the setting and not one byte of the stream; one structured log line per
upstream says so, `errors_total{code="full_text_mismatch"}` counts it, and /readyz stays ready (non-stream requests
work) but reports the finding next to its check, until a stream of the configured form ends it."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import openai
import orjson
import pytest
from hub_harness import request_context

from proxy.dialects.mindie import MindIEDialect
from proxy.errors import StreamTruncated
from proxy.hub.canonical import CHAT
from proxy.hub.events import Answer, Delta, TextRun
from proxy.hub.pipeline import Pipeline
from proxy.settings import UpstreamSettings
from proxy.stream.cumulative import StreamForm

SAY = [{"role": "user", "content": "Tell me a short story about a lighthouse."}]
THINK = [{"role": "user", "content": "hi [mock:think]"}]


def stream_text(proxy: Any, messages: list[dict[str, str]] = SAY) -> tuple[str, str | None]:
    """(the text the client received, the error message that ended the stream or None)."""
    text = ""
    try:
        for chunk in proxy.client().chat.completions.create(model="m", messages=messages, stream=True):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
    except openai.APIError as e:
        return text, e.message
    return text, None


def mismatch_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [json.loads(r.getMessage()) for r in caplog.records if '"stream_form_mismatch"' in r.getMessage()]


def counted(proxy: Any, metric: str, label: str) -> float:
    for line in httpx.get(proxy.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(f"dialect_proxy_{metric}{{") and label in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize(("mock_full_text", "proxy_full_text", "said"), [
    (True, False, "streams cumulative text"), (False, True, "streams true deltas"),
])
def test_a_stream_of_the_other_form_ends_in_an_error_that_names_the_setting(
        start_mock, start_proxy, caplog: pytest.LogCaptureFixture, mock_full_text: bool, proxy_full_text: bool,
        said: str) -> None:
    caplog.set_level(logging.WARNING, logger="dialect_proxy")
    mock = start_mock("mindie", full_text=mock_full_text)
    proxy = start_proxy(mock=mock, full_text=proxy_full_text)
    assert httpx.get(proxy.url + "/readyz", timeout=10).status_code == 200
    for _ in range(2):
        text, error = stream_text(proxy)
        assert text == "" and error is not None and said in error and "full_text" in error, (text, error)
    lines = mismatch_lines(caplog)
    assert len(lines) == 1 and lines[0]["upstream"] == "mock-mindie" and lines[0]["full_text"] is proxy_full_text
    assert counted(proxy, "errors_total", 'code="full_text_mismatch"') == 2
    assert counted(proxy, "truncated_streams_total", 'reason="full_text_mismatch"') == 0  # no stream began
    # Ready: non-stream requests work. The finding is reported beside the readiness check, not mixed into its reason.
    ready = httpx.get(proxy.url + "/readyz", timeout=10)
    assert ready.status_code == 200, ready.text
    body = ready.json()
    summary, check = body["upstreams"]["mock-mindie"], body["checks"]["mock-mindie"]
    assert summary.startswith("up; stream requests fail (non-stream requests work): ") and said in summary
    assert check["ready"] is True and said in check["finding"] and said not in check["reason"]
    # non-stream answers are whole either way
    got = proxy.client().chat.completions.create(model="m", messages=SAY)
    assert got.choices[0].message.content


ROUTES = {
    "/v1/chat/completions": {"model": "m", "stream": True, "messages": THINK},
    "/v1/responses": {"model": "m", "stream": True, "input": THINK[0]["content"]},
    "/v1/messages": {"model": "m", "stream": True, "max_tokens": 100, "messages": THINK},
}


@pytest.mark.parametrize("route", list(ROUTES))
def test_no_byte_of_a_cumulative_stream_with_reasoning_reaches_the_client(start_mock, start_proxy,
                                                                          route: str) -> None:
    """The mock's reasoning in `<think>` as cumulative text: before, two garbage reasoning deltas (`<think>The`,
    `<think>The user`) went out ahead of the error. Now the texts wait for the verdict: the client gets the error
    alone, as an HTTP status in its own envelope, and no retry is invited."""
    proxy = start_proxy(mock=start_mock("mindie", full_text=True), full_text=False)
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01", "x-request-id": "held-1"}
    with httpx.Client(timeout=30) as http:
        got = http.post(proxy.url + route, json=ROUTES[route], headers=headers)
    assert got.status_code == 502, got.text
    assert got.headers["content-type"].startswith("application/json") and got.headers["x-should-retry"] == "false"
    assert "<think>" not in got.text and "data:" not in got.text and "The user" not in got.text
    error = got.json()["error"]
    assert "streams cumulative text" in error["message"] and "full_text: true" in error["message"]


@pytest.mark.parametrize("full_text", [False, True])
@pytest.mark.parametrize("messages", [SAY, THINK], ids=["text", "think"])
def test_matching_settings_stream_cleanly(start_mock, start_proxy, caplog: pytest.LogCaptureFixture,
                                          full_text: bool, messages: list[dict[str, str]]) -> None:
    caplog.set_level(logging.WARNING, logger="dialect_proxy")
    mock = start_mock("mindie", full_text=full_text)
    proxy = start_proxy(mock=mock, full_text=full_text)
    reasoning = text = ""
    for chunk in proxy.client().chat.completions.create(model="m", messages=messages, stream=True):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            reasoning += getattr(chunk.choices[0].delta, "reasoning_content", None) or ""
    whole = proxy.client().chat.completions.create(model="m", messages=messages).choices[0].message
    assert text and text == whole.content
    assert reasoning == (getattr(whole, "reasoning_content", None) or "")
    assert bool(reasoning) is (messages is THINK)
    ready = httpx.get(proxy.url + "/readyz", timeout=10)
    assert not mismatch_lines(caplog) and ready.status_code == 200
    assert "finding" not in ready.json()["checks"]["mock-mindie"]


def test_a_short_cumulative_answer_is_caught_by_its_full_text(start_mock, start_proxy) -> None:
    """Fewer texts than StreamForm reads: MindIE's `full_text` on the finish chunk still says the stream was
    cumulative, and the texts held until then are not sent."""
    proxy = start_proxy(mock=start_mock("mindie", full_text=True))
    text, error = stream_text(proxy, [{"role": "user", "content": "hi [mock:chunks=2]"}])
    assert text == "" and error is not None and "streams cumulative text" in error, (text, error)


# -- in process: what the pipeline holds back, and when it lets go ----------------------------------------------------


def event(content: str | None = None, reasoning: str | None = None, finish: str | None = None,
          **top: Any) -> bytes:
    delta: dict[str, Any] = {"role": "assistant"}
    if content is not None:
        delta["content"] = content
    if reasoning is not None:
        delta["reasoning_content"] = reasoning
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + orjson.dumps({"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "qwen",
                                     "choices": [choice], **top}) + b"\n\n"


def pipeline(dialect: MindIEDialect, full_text: bool) -> Pipeline:
    up = UpstreamSettings(name="m", dialect="mindie", url="http://127.0.0.1:9", full_text=full_text)
    return Pipeline(dialect.session(request_context(CHAT, "qwen", up, stream=True)), Answer())


def texts(events: list[Delta | TextRun]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for e in events:
        for d in e.deltas() if isinstance(e, TextRun) else [e]:
            if d.content or d.reasoning:
                out.append((d.reasoning, d.content))
    return out


def test_the_first_texts_wait_for_the_verdict_then_go_in_order() -> None:
    p = pipeline(MindIEDialect(), full_text=True)
    out: list[Delta | TextRun] = []
    snapshots = ["Hello", "Hello from", "Hello from the", "Hello from the sea"]
    for snapshot in snapshots[:3]:
        p.feed(event(snapshot), out)
        assert texts(out) == []  # the form is not known yet
    p.feed(event(snapshots[3]), out)  # the fourth text settles it: cumulative, as configured
    assert texts(out) == [("", "Hello"), ("", " from"), ("", " the"), ("", " sea")]
    p.feed(event("Hello from the sea!"), out)
    assert texts(out)[-1] == ("", "!")  # after the verdict nothing waits
    p.feed(event("", finish="stop", full_text="Hello from the sea!"), out)
    p.finish(out)


def test_reasoning_in_its_own_field_is_not_held() -> None:
    """MindIE's reasoning_content is a true delta in either mode: a long reasoning phase streams as it comes; only
    the answer's first texts wait."""
    p = pipeline(MindIEDialect(), full_text=True)
    out: list[Delta | TextRun] = []
    for piece in ("Think", "ing", " hard"):
        p.feed(event("", reasoning=piece), out)
    assert texts(out) == [("Think", ""), ("ing", ""), (" hard", "")]
    p.feed(event("Hi"), out)
    assert len(texts(out)) == 3


def test_a_short_answer_is_handed_on_at_its_end() -> None:
    p = pipeline(MindIEDialect(), full_text=False)
    out: list[Delta | TextRun] = []
    p.feed(event("Hi"), out)
    p.feed(event(" there"), out)
    assert texts(out) == []
    p.feed(event("", finish="stop") + b"data: [DONE]\n\n", out)
    p.finish(out)
    assert texts(out) == [("", "Hi"), ("", " there")]


def test_a_stream_of_the_configured_form_ends_the_finding() -> None:
    dialect = MindIEDialect()
    cumulative = [event(t) for t in ("<think>", "<think>The", "<think>The user", "<think>The user greets")]
    out: list[Delta | TextRun] = []
    p = pipeline(dialect, full_text=False)
    with pytest.raises(StreamTruncated) as e:
        for raw in cumulative:
            p.feed(raw, out)
    assert e.value.code == "full_text_mismatch" and out == []  # nothing of it was handed on
    assert dialect.finding is not None and "streams cumulative text" in dialect.finding
    # MindIE restarted with fullTextEnabled: false: its next stream is deltas, as configured
    p = pipeline(dialect, full_text=False)
    for piece in ("Once", " upon", " a", " time"):
        p.feed(event(piece), out)
    assert dialect.finding is None and texts(out)[0] == ("", "Once")


@pytest.mark.parametrize(("texts", "verdict"), [
    (["Hello", "Hello from", "Hello from the", "Hello from the sea"], "cumulative"),
    (["caf\ufffd", "café", "café au", "café au lait"], "cumulative"),  # a half character resolved still extends
    (["Hello", " from", " the", " sea"], "deltas"),
    ([" at", " the", " theater", " theatergoers", "!"], ""),  # two extensions in a row by chance: undecided
    (["", "Hello", "", " there"], ""),  # empty texts say nothing; too few texts: undecided
])
def test_stream_form_verdicts(texts: list[str], verdict: str) -> None:
    form = StreamForm()
    verdicts = [form.feed(t) for t in texts if form.open]
    assert [v for v in verdicts if v] == ([verdict] if verdict else [])
