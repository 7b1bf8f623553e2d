"""A stream of the other form than `full_text` says is never passed on silently (proxy/stream/cumulative.py
StreamForm, proxy/dialects/mindie.py): the mock with fullTextEnabled in front of a proxy without `full_text`, and the
reverse. The stream ends with an error event that names the setting, one structured log line per upstream says so,
`truncated_streams_total{reason="full_text_mismatch"}` counts it, and /readyz is not ready with the same reason."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import openai
import pytest

from proxy.stream.cumulative import StreamForm

SAY = [{"role": "user", "content": "Tell me a short story about a lighthouse."}]


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


def truncated(proxy: Any) -> float:
    for line in httpx.get(proxy.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("dialect_proxy_truncated_streams_total{") and 'reason="full_text_mismatch"' in line:
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
        assert error is not None and said in error and "full_text" in error, (text, error)
    lines = mismatch_lines(caplog)
    assert len(lines) == 1 and lines[0]["upstream"] == "mock-mindie" and lines[0]["full_text"] is proxy_full_text
    assert truncated(proxy) == 2
    ready = httpx.get(proxy.url + "/readyz", timeout=10)
    assert ready.status_code == 503 and said in ready.json()["upstreams"]["mock-mindie"]
    # non-stream answers are whole either way
    got = proxy.client().chat.completions.create(model="m", messages=SAY)
    assert got.choices[0].message.content


def test_a_short_cumulative_answer_is_caught_by_its_full_text(start_mock, start_proxy) -> None:
    """Fewer texts than StreamForm reads: MindIE's `full_text` on the finish chunk still says the stream was
    cumulative."""
    proxy = start_proxy(mock=start_mock("mindie", full_text=True))
    text, error = stream_text(proxy, [{"role": "user", "content": "hi [mock:chunks=2]"}])
    assert error is not None and "streams cumulative text" in error, (text, error)


@pytest.mark.parametrize("full_text", [False, True])
def test_matching_settings_stream_cleanly(start_mock, start_proxy, caplog: pytest.LogCaptureFixture,
                                          full_text: bool) -> None:
    caplog.set_level(logging.WARNING, logger="dialect_proxy")
    mock = start_mock("mindie", full_text=full_text)
    proxy = start_proxy(mock=mock, full_text=full_text)
    text, error = stream_text(proxy)
    assert error is None and text
    assert proxy.client().chat.completions.create(model="m", messages=SAY).choices[0].message.content == text
    assert not mismatch_lines(caplog) and httpx.get(proxy.url + "/readyz", timeout=10).status_code == 200


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
