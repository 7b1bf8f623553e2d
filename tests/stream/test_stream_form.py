"""A stream of the other form than `full_text` says is never passed on as an answer (proxy/stream/cumulative.py
StreamForm, proxy/dialects/mindie.py, proxy/hub/pipeline.py): the mock with fullTextEnabled in front of a proxy without
`full_text`, and the reverse. Without `full_text` the stream's first texts are held back until their form is known, so
a cumulative stream gets an HTTP 502 `full_text_mismatch` that names the setting and not one byte of the stream. With
`full_text` a text goes at once while it is right under the configured form (the first text, then each that extends
the one before), so its first frame is not held back; a delta stream then ends with the `full_text_mismatch` error
event, never `[DONE]`. One structured log line per upstream says so, `errors_total{code="full_text_mismatch"}` counts
it, and /readyz stays ready (non-stream requests work) but reports the finding next to its check, until a stream of
the configured form ends it."""

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
from proxy.hub.events import Answer, Delta
from proxy.hub.pipeline import Pipeline
from proxy.settings import UpstreamSettings
from proxy.stream.cumulative import FORM_TEXTS, StreamForm
from tests.conftest import wait_for

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


@pytest.mark.parametrize(("mock_full_text", "proxy_full_text", "said", "seen"), [
    (True, False, "streams cumulative text", {""}),
    # With full_text the first text ("Hello", the same in either form) goes at once; whether it is read before the
    # texts that settle the form depends on how the upstream's writes fall into reads (the in-process test below
    # fixes the order).
    (False, True, "streams true deltas", {"", "Hello"}),
])
def test_a_stream_of_the_other_form_ends_in_an_error_that_names_the_setting(
        start_mock, start_proxy, caplog: pytest.LogCaptureFixture, mock_full_text: bool, proxy_full_text: bool,
        said: str, seen: set[str]) -> None:
    caplog.set_level(logging.WARNING, logger="dialect_proxy")
    mock = start_mock("mindie", full_text=mock_full_text)
    proxy = start_proxy(mock=mock, full_text=proxy_full_text)
    assert httpx.get(proxy.url + "/readyz", timeout=10).status_code == 200
    for _ in range(2):
        text, error = stream_text(proxy)
        assert text in seen and error is not None and said in error and "full_text" in error, (text, error)
    lines = mismatch_lines(caplog)
    assert len(lines) == 1 and lines[0]["upstream"] == "mock-mindie" and lines[0]["full_text"] is proxy_full_text
    assert counted(proxy, "errors_total", 'code="full_text_mismatch"') == 2
    if not proxy_full_text:
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


def test_a_short_delta_answer_is_caught_by_the_missing_full_text(start_mock, start_proxy) -> None:
    """With `full_text`, a delta stream too short to settle its form (`tok0`, ` tok1`): its finish chunk lacks the
    `full_text` that full-text mode sends, so the held second text ("ok1" read as a snapshot) never goes out."""
    proxy = start_proxy(mock=start_mock("mindie", full_text=False), full_text=True)
    text, error = stream_text(proxy, [{"role": "user", "content": "hi [mock:chunks=2]"}])
    assert text in ("", "tok0") and error is not None and "streams true deltas" in error, (text, error)


def sse_contents(lines: Any) -> Any:
    """The non-empty `content` of each chat chunk among SSE lines, as they come (other lines are skipped)."""
    for line in lines:
        if line.startswith("data: {"):
            for choice in orjson.loads(line[6:]).get("choices") or ():
                if choice.get("delta", {}).get("content"):
                    yield choice["delta"]["content"]


def test_with_full_text_the_first_text_is_not_held_back(start_mock, start_proxy) -> None:
    """The frame the bench saw held back (docs/speed.md, issue 48 item 4): with `full_text` the answer's first
    text is the same in either form, so it reaches the client at once. The mock sends it and then goes silent
    (`stall=1`) until the client leaves, so the client can only have it if nothing waited for a later text."""
    mock = start_mock("mindie", full_text=True)
    proxy = start_proxy(mock=mock, full_text=True)
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi [mock:stall=1]"}]}
    with httpx.Client(timeout=30) as http, http.stream("POST", proxy.url + "/v1/chat/completions", json=body) as got:
        assert got.status_code == 200
        lines = got.iter_lines()  # (kept: a dropped generator would close the response)
        # Bounded without a clock of the test's own: the proxy's first keep-alive comment (15 s of silence) would come
        # first if the text were held, and the mock stays silent for 120 s.
        first = next(line for line in lines if line.startswith(":") or '"content":"' in line and '""' not in line)
        assert '"content":"Hello"' in first, first
        assert mock.stats()["in_flight"] == 1  # the upstream is still silent after its first text
    assert wait_for(lambda: mock.stats()["disconnects"] == 1)  # it went away when the client did


def test_with_full_text_a_delta_stream_never_ends_as_an_answer(start_mock, start_proxy) -> None:
    """Raw SSE: whatever the client saw first (at most the first text, right in either form), the stream ends with
    the error event that names the setting and without `[DONE]`, so no client takes it for a whole answer."""
    proxy = start_proxy(mock=start_mock("mindie", full_text=False), full_text=True)
    with httpx.Client(timeout=30) as http:
        got = http.post(proxy.url + "/v1/chat/completions", json={"model": "m", "stream": True, "messages": SAY})
    if got.status_code == 200:  # the first text went out before the form was known
        lines = got.text.splitlines()
        assert "".join(sse_contents(lines)) in ("", "Hello")
        assert "[DONE]" not in got.text
        errors = [orjson.loads(line[6:])["error"] for line in lines if line.startswith('data: {"error"')]
        assert len(errors) == 1 and errors[0]["code"] == "full_text_mismatch", got.text
        assert "streams true deltas" in errors[0]["message"]
    else:  # all of the first texts came in one read: the error alone
        assert got.status_code == 502 and got.json()["error"]["code"] == "full_text_mismatch", got.text


def test_without_full_text_a_cumulative_stream_that_revises_its_text_sends_no_byte(start_mock, start_proxy) -> None:
    """A cumulative snapshot that does not extend the one before (MindIE revising text: `[mock:rewrite]`, snapshots
    `Hello`, `Hello wor`, `Hello, world`, `Hello, world!`) is not taken for a delta stream: before, its four
    snapshots went out as deltas ("HelloHello wor…") ahead of the error."""
    proxy = start_proxy(mock=start_mock("mindie", full_text=True), full_text=False)
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi [mock:rewrite]"}]}
    with httpx.Client(timeout=30) as http:
        got = http.post(proxy.url + "/v1/chat/completions", json=body)
    assert got.status_code == 502 and "Hello" not in got.text, got.text
    assert "streams cumulative text" in got.json()["error"]["message"]


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


def texts(events: list[Delta]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for e in events:
        if e.content or e.reasoning:
            out.append((e.reasoning, e.content))
    return out


def test_with_full_text_texts_that_extend_go_at_once() -> None:
    p = pipeline(MindIEDialect(), full_text=True)
    out: list[Delta] = []
    for snapshot, delta in [("Hello", "Hello"), ("Hello from", " from"), ("Hello from the", " the"),
                            ("Hello from the sea", " sea"), ("Hello from the sea!", "!")]:
        p.feed(event(snapshot), out)
        assert texts(out)[-1] == ("", delta)  # each read's text is handed on with it
    p.feed(event("", finish="stop", full_text="Hello from the sea!") + b"data: [DONE]\n\n", out)
    p.finish(out)
    assert "".join(c for _, c in texts(out)) == "Hello from the sea!"


def test_with_full_text_a_text_that_does_not_extend_waits_for_the_verdict() -> None:
    """A revised snapshot is right only if the stream is cumulative: it waits, and the texts after it, until three
    texts have extended the one before (cumulative, as configured), then all go on in order."""
    p = pipeline(MindIEDialect(), full_text=True)
    out: list[Delta] = []
    p.feed(event("Hello"), out)
    p.feed(event("Hello wor"), out)
    assert texts(out) == [("", "Hello"), ("", " wor")]
    for snapshot in ("Hello, world", "Hello, world!"):  # a revision, then one extension: not settled yet
        p.feed(event(snapshot), out)
        assert len(texts(out)) == 2
    p.feed(event("Hello, world! Bye"), out)  # the third extension settles it
    assert texts(out)[2:] == [("", "ld"), ("", "!"), ("", " Bye")]  # docs/mindie.md "Rewrites in full-text mode"


def test_with_full_text_a_delta_stream_ends_after_its_first_text() -> None:
    """The first text went out (it is the same in either form); the next texts do not extend the one before, so
    they wait, and the second of them settles it: deltas. The error ends the stream and what waited is dropped."""
    dialect = MindIEDialect()
    p = pipeline(dialect, full_text=True)
    out: list[Delta] = []
    p.feed(event("Hello"), out)
    p.feed(event(" from"), out)
    assert texts(out) == [("", "Hello")]
    with pytest.raises(StreamTruncated) as e:
        p.feed(event(" the"), out)
    assert e.value.code == "full_text_mismatch" and "streams true deltas" in e.value.message
    assert texts(out) == [("", "Hello")]
    assert dialect.finding is not None and "streams true deltas" in dialect.finding


def test_with_full_text_a_short_stream_is_judged_at_its_finish() -> None:
    """Too few texts to settle the form, one of them not extending the one before: the finish chunk decides. With
    MindIE's `full_text` on it the stream was cumulative (a revision: what waited goes on); without it, deltas."""
    p = pipeline(MindIEDialect(), full_text=True)
    out: list[Delta] = []
    for snapshot in ("Hello", "Hello wor", "Hello, world"):
        p.feed(event(snapshot), out)
    assert texts(out) == [("", "Hello"), ("", " wor")]
    p.feed(event("Hello, world!", finish="stop", full_text="Hello, world!") + b"data: [DONE]\n\n", out)
    p.finish(out)
    assert texts(out)[2:] == [("", "ld"), ("", "!")]

    p = pipeline(MindIEDialect(), full_text=True)
    out = []
    p.feed(event("Hi"), out)
    p.feed(event(" there"), out)
    with pytest.raises(StreamTruncated) as e:
        p.feed(event("!", finish="stop") + b"data: [DONE]\n\n", out)
    assert e.value.code == "full_text_mismatch" and texts(out) == [("", "Hi")]


@pytest.mark.parametrize("full_text", [False, True])
def test_reasoning_in_its_own_field_is_not_held(full_text: bool) -> None:
    """MindIE's reasoning_content is a true delta in either mode: a long reasoning phase streams as it comes; only
    the answer's first texts may wait."""
    p = pipeline(MindIEDialect(), full_text=full_text)
    out: list[Delta] = []
    for piece in ("Think", "ing", " hard"):
        p.feed(event("", reasoning=piece), out)
    assert texts(out) == [("Think", ""), ("ing", ""), (" hard", "")]
    p.feed(event("Hi"), out)
    assert len(texts(out)) == (4 if full_text else 3)


def test_without_full_text_a_delta_stream_waits_for_its_second_text_that_does_not_extend() -> None:
    """One text that does not extend the one before does not prove deltas (a cumulative upstream may revise its
    text: docs/mindie.md "Rewrites in full-text mode"); the second does."""
    p = pipeline(MindIEDialect(), full_text=False)
    out: list[Delta] = []
    for piece in ("Once", " upon"):
        p.feed(event(piece), out)
        assert texts(out) == []
    p.feed(event(" a"), out)
    assert texts(out) == [("", "Once"), ("", " upon"), ("", " a")]
    p.feed(event(" time"), out)
    assert texts(out)[-1] == ("", " time")


def test_without_full_text_a_revised_cumulative_stream_is_still_caught() -> None:
    """Three extensions with one revision among them: cumulative, and nothing of it was handed on."""
    p = pipeline(MindIEDialect(), full_text=False)
    out: list[Delta] = []
    with pytest.raises(StreamTruncated) as e:
        for snapshot in ("Hello", "Hello wor", "Hello, world", "Hello, world!", "Hello, world! Bye"):
            p.feed(event(snapshot), out)
    assert e.value.code == "full_text_mismatch" and out == []


def test_a_short_answer_is_handed_on_at_its_end() -> None:
    p = pipeline(MindIEDialect(), full_text=False)
    out: list[Delta] = []
    p.feed(event("Hi"), out)
    p.feed(event(" there"), out)
    assert texts(out) == []
    p.feed(event("", finish="stop") + b"data: [DONE]\n\n", out)
    p.finish(out)
    assert texts(out) == [("", "Hi"), ("", " there")]


def test_a_stream_of_the_configured_form_ends_the_finding() -> None:
    dialect = MindIEDialect()
    cumulative = [event(t) for t in ("<think>", "<think>The", "<think>The user", "<think>The user greets")]
    out: list[Delta] = []
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


@pytest.mark.parametrize(("texts", "verdict", "read"), [
    (["Hello", "Hello from", "Hello from the", "Hello from the sea"], "cumulative", 4),
    (["caf\ufffd", "café", "café au", "café au lait"], "cumulative", 4),  # a half character resolved still extends
    (["Hello", "Hello", "Hello from", "Hello from the", "Hello from the sea"], "cumulative", 5),  # a repeat: skipped
    (["Hello", "Hello wor", "Hello, world", "Hello, world!", "Hello, world! Bye"], "cumulative", 5),  # one revision
    (["Hello", " from", " the", " sea"], "deltas", 3),
    (["Hello", "Hello wor", "Hello, world", "Hello, world"], "", 4),  # the repeat says nothing: not settled yet
    ([" at", " the", " theater", " theatergoers", "!"], "deltas", 5),  # two extensions by chance, then a second no
    (["", "Hello", "", " there"], "", 4),  # empty texts say nothing; too few texts: undecided
])
def test_stream_form_verdicts(texts: list[str], verdict: str, read: int) -> None:
    form = StreamForm()
    verdicts = [form.feed(t) for t in texts if form.open]
    assert [v for v in verdicts if v] == ([verdict] if verdict else [])
    assert len(verdicts) == read and form.open is not bool(verdict)
    assert len([t for t in texts if t]) <= FORM_TEXTS or form.open is False
