"""The Responses API's WebSocket mode (proxy/server/responses_socket.py, proxy/server/websocket.py) end to end, with the
`websockets` client against the proxy in front of the built-in mock: events, continuation from the connection's
state, errors, and the front end's limits for WebSocket connections."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.clients.test_responses_e2e import TOOL, greeting
from tests.conftest import Mock, Proxy, wait_for

TERMINAL = ("response.completed", "response.incomplete", "response.failed", "error")


def ws_url(proxy: Proxy) -> str:
    return proxy.url.replace("http://", "ws://") + "/v1/responses"


def turn(ws: ClientConnection, **body: Any) -> list[dict[str, Any]]:
    """One response.create and its events, up to the terminal one (bounded: 30 s)."""
    ws.send(json.dumps({"type": "response.create", **body}))
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    while not events or events[-1]["type"] not in TERMINAL:
        events.append(json.loads(ws.recv(timeout=max(deadline - time.monotonic(), 0.01))))
    return events


@pytest.fixture
def stack(start_mock: Callable[..., Mock], start_proxy: Callable[..., Proxy]) -> Callable[..., tuple[Mock, Proxy]]:
    def start(**proxy_kw: Any) -> tuple[Mock, Proxy]:
        mock = start_mock("mindie", full_text=True)
        return mock, start_proxy(mock=mock, full_text=True, **proxy_kw)
    return start


def test_response_create_streams_the_sse_events(stack: Callable[..., tuple[Mock, Proxy]]) -> None:
    mock, proxy = stack()
    with connect(ws_url(proxy)) as ws:
        events = turn(ws, model="m", input="Hello!")
        sse = httpx.post(proxy.base_url + "/responses", json={"model": "m", "input": "Hello!", "stream": True})
    names = [e["type"] for e in events]
    assert names[:2] == ["response.created", "response.in_progress"] and names[-1] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == greeting("mindie")
    # the same event sequence as the HTTP stream's
    http_names = [line[7:] for line in sse.text.splitlines() if line.startswith("event: ")]
    assert names == http_names
    assert mock.stats()["completed"] == 2


def test_events_follow_the_responses_spec_setting(stack: Callable[..., tuple[Mock, Proxy]]) -> None:
    """The WebSocket mode sends the raw-reasoning events under the names client.responses_spec chooses, as SSE."""
    for responses_spec, name in (("openai_api", "response.reasoning_text"), ("open_responses", "response.reasoning")):
        _, proxy = stack(client={"responses_spec": responses_spec})
        with connect(ws_url(proxy)) as ws:
            events = turn(ws, model="m", input="Hi [mock:think]")
        names = [e["type"] for e in events]
        assert names.count(name + ".done") == 1 and name + ".delta" in names, (responses_spec, names)
        reasoning = events[-1]["response"]["output"][0]["content"][0]["text"]
        assert "".join(e["delta"] for e in events if e["type"] == name + ".delta") == reasoning and reasoning
    assert "response.reasoning_text.delta" not in names


def test_continuation_from_the_connections_state(stack: Callable[..., tuple[Mock, Proxy]]) -> None:
    """store: false continues on the same socket (only the new input sent); after a reconnect it is not found,
    and a new chain without previous_response_id works; a store: true response continues on any connection."""
    mock, proxy = stack()
    with connect(ws_url(proxy)) as ws:
        first = turn(ws, model="m", store=False, input="Remember the code word: cobalt.")[-1]["response"]
        second = turn(ws, model="m", store=False, previous_response_id=first["id"], input="The code word?")
        assert second[-1]["type"] == "response.completed"
        messages = mock.last_request()["body"]["messages"]
        assert [m["content"] for m in messages if m["role"] == "user"] == ["Remember the code word: cobalt.",
                                                                          "The code word?"]
        stored = turn(ws, model="m", input="Stored one.")[-1]["response"]
    with connect(ws_url(proxy)) as ws:
        missing = turn(ws, model="m", store=False, previous_response_id=second[-1]["response"]["id"], input="Again")
        assert missing == [{"type": "error", "status": 400, "error": {
            "type": "invalid_request_error", "code": "previous_response_not_found", "param": "previous_response_id",
            "message": missing[0]["error"]["message"]}}]
        assert turn(ws, model="m", store=False, input="Start over.")[-1]["type"] == "response.completed"
        assert turn(ws, model="m", previous_response_id=stored["id"], input="Go on.")[-1]["type"] == \
            "response.completed"


def test_a_failed_continuation_evicts_the_previous_response(stack: Callable[..., tuple[Mock, Proxy]]) -> None:
    mock, proxy = stack()
    with connect(ws_url(proxy)) as ws:
        first = turn(ws, model="m", store=False, input="Remember: ember.")[-1]["response"]
        failed = turn(ws, model="m", store=False, previous_response_id=first["id"],
                      input=[{"type": "function_call_output", "call_id": "call_missing", "output": "x"}])
        assert failed[-1]["type"] == "error" and failed[-1]["error"]["code"] == "tool_call_not_found"
        again = turn(ws, model="m", store=False, previous_response_id=first["id"], input="Stale?")
        assert again[-1]["error"]["code"] == "previous_response_not_found"
        # the connection is still good
        assert turn(ws, model="m", store=False, input="Fine?")[-1]["type"] == "response.completed"


def test_messages_that_are_not_response_create(stack: Callable[..., tuple[Mock, Proxy]]) -> None:
    mock, proxy = stack()
    with connect(ws_url(proxy)) as ws:
        ws.send("not json")
        assert json.loads(ws.recv(timeout=10))["error"]["code"] == "invalid_json"
        ws.send(json.dumps({"type": "session.update"}))
        assert json.loads(ws.recv(timeout=10))["error"]["code"] == "invalid_event_type"
        assert turn(ws, model="m", input="Hello!", tools=[TOOL])[-1]["type"] == "response.completed"
    assert mock.stats()["requests"] == 1


def test_compaction_then_a_new_chain(stack: Callable[..., tuple[Mock, Proxy]]) -> None:
    mock, proxy = stack()
    compacted = httpx.post(proxy.base_url + "/responses/compact", timeout=30, json={
        "model": "m", "input": [{"role": "user", "content": "Remember: slate."}]}).json()["output"]
    with connect(ws_url(proxy)) as ws:
        events = turn(ws, model="m", store=False, input=[*compacted, {"role": "user", "content": "Continue."}])
    assert events[-1]["type"] == "response.completed"
    assert greeting("mindie") in json.dumps(mock.last_request()["body"], ensure_ascii=False)


def test_an_oversized_message_closes_with_1009(stack: Callable[..., tuple[Mock, Proxy]]) -> None:
    mock, proxy = stack(server={"max_body_bytes": 4096})
    with connect(ws_url(proxy), max_size=None) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "m", "input": "x" * 5000}))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    assert mock.stats()["requests"] == 0


def test_an_idle_connection_is_closed(stack: Callable[..., tuple[Mock, Proxy]]) -> None:
    _, proxy = stack(server={"ws_idle_timeout": 0.5})
    with connect(ws_url(proxy)) as ws:
        assert turn(ws, model="m", input="Hello!")[-1]["type"] == "response.completed"
        started = time.monotonic()
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
    assert 0.3 < time.monotonic() - started < 5


def test_a_websocket_counts_as_a_connection(stack: Callable[..., tuple[Mock, Proxy]]) -> None:
    _, proxy = stack(server={"max_client_connections": 1})
    with connect(ws_url(proxy)) as ws:
        assert turn(ws, model="m", input="Hello!")[-1]["type"] == "response.completed"
        refused = httpx.get(proxy.url + "/healthz", timeout=10)  # the open WebSocket holds the one slot
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "too_many_connections"
    # closed: a new one is accepted
    assert wait_for(lambda: _opens(proxy), timeout=5)


def _opens(proxy: Proxy) -> bool:
    try:
        with connect(ws_url(proxy), open_timeout=5):
            return True
    except InvalidStatus:
        return False


def test_the_client_leaving_cancels_the_upstream_request(stack: Callable[..., tuple[Mock, Proxy]]) -> None:
    mock, proxy = stack()
    ws = connect(ws_url(proxy))
    ws.send(json.dumps({"type": "response.create", "model": "m", "input": "Slow. [mock:chunks=200,delay_ms=50]"}))
    assert json.loads(ws.recv(timeout=10))["type"] == "response.created"
    ws.close()
    assert wait_for(lambda: mock.stats()["disconnects"] == 1, timeout=5), mock.stats()
    assert mock.stats()["completed"] == 0


def test_api_key_and_unknown_paths_are_refused_with_the_envelope(stack: Callable[..., tuple[Mock, Proxy]]) -> None:
    _, proxy = stack(server={"api_keys_env": "KEYS"}, environ={"KEYS": "sk-right"})
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_url(proxy), open_timeout=10)
    assert refused.value.response.status_code == 401
    assert json.loads(refused.value.response.body)["error"]["type"] == "authentication_error"
    with connect(ws_url(proxy), additional_headers={"Authorization": "Bearer sk-right"}) as ws:
        assert turn(ws, model="m", input="Hello!")[-1]["type"] == "response.completed"
    with pytest.raises(InvalidStatus) as missing:
        connect(proxy.url.replace("http://", "ws://") + "/v1/chat/completions",
                additional_headers={"Authorization": "Bearer sk-right"}, open_timeout=10)
    assert missing.value.response.status_code == 404


def test_each_response_is_one_access_log_line_as_on_http(stack: Callable[..., tuple[Mock, Proxy]],
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """A response on a socket is one exchange of the endpoint: its access line says what an HTTP stream's says, and
    an error before the answer is the socket's `error` message with the same status and code as the line."""
    caplog.set_level(logging.INFO, logger="dialect_proxy.access")
    mock, proxy = stack()
    with connect(ws_url(proxy)) as ws:
        done = turn(ws, model="m", input="Hello!")[-1]
        refused = turn(ws, model="m", input=5)
    assert done["type"] == "response.completed" and refused[0]["type"] == "error"
    wait_for(lambda: any(json.loads(r.getMessage()).get("websocket") for r in caplog.records
                         if r.name == "dialect_proxy.access"), timeout=10)
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "dialect_proxy.access"]
    answered, failed, connection = lines[-3:]
    assert answered["route"] == "/v1/responses" and answered["model"] == "m" and answered["stream"] is True
    assert answered["status"] == 200 and answered["finish_reason"] == "stop" and answered["completion_tokens"] > 0
    assert answered["client_disconnected"] is False and answered["ttft_ms"] is not None
    assert failed["status"] == refused[0]["status"] == 400 and failed["error"] == refused[0]["error"]["code"]
    assert connection["websocket"] is True and connection["responses"] == 2
