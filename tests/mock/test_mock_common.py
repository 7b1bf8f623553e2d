"""Behaviour every mock dialect shares: introspection, health, disconnect accounting, connection-level directives."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from mockutil import MockServer, chat, parse_sse

from proxy.dialects import DIALECTS as SPOKES
from proxy.mock import DIALECTS, create_app, run
from proxy.mock.scenario import from_chat, from_prompt, parse

# The mocks of chat upstreams: the TEI mock serves embeddings and rerank alone (tests/test_e2e_retrieval.py).
CHAT_MOCKS = tuple(d for d in DIALECTS if SPOKES[d]().path("chat"))


def request_for(dialect: str, text: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    """The chat path and a minimal valid body for `dialect`."""
    if dialect == "engine":
        body = chat(text, **extra)
        del body["model"]
        return "/chat", body
    if dialect == "deepseek":
        return "/chat/completions", chat(text, model="deepseek-flash", thinking={"type": "disabled"}, **extra)
    return "/v1/chat/completions", chat(text, **extra)


def test_interface() -> None:
    assert set(DIALECTS) == {"openai", "mindie", "siliconstorm", "deepseek", "engine", "vllm", "tei"}
    assert callable(run)
    with pytest.raises(ValueError, match="unknown mock dialect"):
        create_app("sglang")


@pytest.mark.parametrize("dialect", CHAT_MOCKS)
def test_health_and_models(mock_servers: Any, dialect: str) -> None:
    srv: MockServer = mock_servers(dialect)
    health = srv.client.get("/health")
    assert health.status_code == 200 and health.content == b""
    models = srv.client.get("/models" if dialect == "deepseek" else "/v1/models")
    if dialect == "engine":
        assert models.status_code == 404
    else:
        assert models.status_code == 200
        data = models.json()
        assert data["object"] == "list" and data["data"] and data["data"][0]["object"] == "model"
    assert srv.stats()["requests"] == 0  # only inference requests count


@pytest.mark.parametrize("dialect", CHAT_MOCKS)
def test_stats_and_last_request(mock_servers: Any, dialect: str) -> None:
    srv: MockServer = mock_servers(dialect)
    path, body = request_for(dialect, "hello there")
    resp = srv.post(path, body, headers={"X-Request-ID": "abc", "Authorization": "Bearer k"})
    assert resp.status_code == 200, resp.text
    assert srv.stats() == {"requests": 1, "completed": 1, "disconnects": 0, "in_flight": 0,
                           "model_lists": 0, "checks": 0}
    last = srv.last_request()
    assert last["method"] == "POST" and last["path"] == path
    assert last["headers"]["x-request-id"] == "abc" and last["headers"]["authorization"] == "Bearer k"
    assert last["body"] == body
    srv.post(path, b"{not json")
    assert srv.last_request()["body"] is None
    recorded = srv.client.get("/_mock/requests").json()  # every one, oldest first
    assert [r["body"] for r in recorded] == [body, None] and recorded[-1] == srv.last_request()
    for n in range(40):  # bounded: the most recent 32
        srv.post(path, request_for(dialect, f"message {n}")[1])
    recorded = srv.client.get("/_mock/requests").json()
    assert len(recorded) == 32 and recorded[-1]["body"]["messages"][-1]["content"] == "message 39"
    assert srv.client.post("/_mock/reset").json()["requests"] == 0
    assert srv.client.get("/_mock/requests").json() == []
    assert srv.stats() == {"requests": 0, "completed": 0, "disconnects": 0, "in_flight": 0,
                           "model_lists": 0, "checks": 0}
    # the proxy's readiness checks (x-dialect-proxy-check) are answered alike and counted apart
    checked = srv.post(path, body, headers={"x-dialect-proxy-check": "readiness"})
    assert checked.status_code == 200
    assert srv.stats() == {"requests": 0, "completed": 0, "disconnects": 0, "in_flight": 0,
                           "model_lists": 0, "checks": 1}
    assert srv.last_request() is None


@pytest.mark.parametrize("dialect", CHAT_MOCKS)
def test_disconnect_mid_stream_is_counted(mock_servers: Any, dialect: str) -> None:
    srv: MockServer = mock_servers(dialect)
    path, body = request_for(dialect, "go [mock:chunks=50][mock:delay_ms=100]", stream=True)
    with srv.client.stream("POST", path, json=body) as resp:
        assert resp.status_code == 200
        seen = 0
        for line in resp.iter_lines():
            if line.startswith("data: "):
                seen += 1
                if seen == 3:
                    break
    stats = srv.wait_stats(lambda s: s["disconnects"] == 1, timeout=1.0)
    assert stats["disconnects"] == 1 and stats["completed"] == 0
    assert srv.wait_stats(lambda s: s["in_flight"] == 0)["in_flight"] == 0


@pytest.mark.parametrize("directive", ["first_byte_ms=5000", "hang"])
@pytest.mark.parametrize("stream", [False, True])
def test_disconnect_before_headers_is_counted(mock_servers: Any, directive: str, stream: bool) -> None:
    srv: MockServer = mock_servers("mindie")
    with pytest.raises(httpx.ReadTimeout):
        srv.post("/v1/chat/completions", chat(f"x [mock:{directive}]", stream=stream), timeout=0.3)
    stats = srv.wait_stats(lambda s: s["disconnects"] == 1, timeout=1.0)
    assert stats == {"requests": 1, "completed": 0, "disconnects": 1, "in_flight": 0,
                           "model_lists": 0, "checks": 0}


def test_first_byte_delay(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("openai")
    start = time.monotonic()
    resp = srv.post("/v1/chat/completions", chat("x [mock:first_byte_ms=300]"))
    assert resp.status_code == 200 and time.monotonic() - start >= 0.29


def test_hang_gives_up_by_itself(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("openai")
    start = time.monotonic()
    with pytest.raises(httpx.RemoteProtocolError):
        srv.post("/v1/chat/completions", chat("x [mock:hang=1]"))
    assert 0.9 < time.monotonic() - start < 5


def test_delay_between_pieces(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("openai")
    arrivals = []
    start = time.monotonic()
    with srv.client.stream("POST", "/v1/chat/completions",
                           json=chat("x [mock:chunks=4,delay_ms=100]", stream=True)) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: "):
                arrivals.append(time.monotonic() - start)
    assert len(arrivals) == 1 + 4 + 1 + 1  # role chunk, pieces, finish chunk, [DONE]
    assert arrivals[-1] >= 0.39


@pytest.mark.parametrize("dialect", CHAT_MOCKS)
def test_drop_before(mock_servers: Any, dialect: str) -> None:
    srv: MockServer = mock_servers(dialect)
    path, body = request_for(dialect, "x [mock:drop_before]", stream=True)
    with pytest.raises(httpx.RemoteProtocolError):
        srv.post(path, body)
    assert srv.wait_stats(lambda s: s["in_flight"] == 0) == {"requests": 1, "completed": 0, "disconnects": 0,
                                                             "in_flight": 0,
                           "model_lists": 0, "checks": 0}


@pytest.mark.parametrize("dialect", CHAT_MOCKS)
def test_drop_mid_stream(mock_servers: Any, dialect: str) -> None:
    srv: MockServer = mock_servers(dialect)
    path, body = request_for(dialect, "x [mock:chunks=10,drop=4]", stream=True)
    lines: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError), srv.client.stream("POST", path, json=body) as resp:
        assert resp.status_code == 200
        lines.extend(resp.iter_lines())
    events = parse_sse("\n".join(lines) + "\n\n")
    texts = [e for e in events if isinstance(e, dict)]
    assert "[DONE]" not in events
    assert all(c["finish_reason"] is None for e in texts for c in e["choices"])
    pieces = "".join(c["delta"].get("content") or "" for e in texts for c in e["choices"])
    assert pieces == "tok0 tok1 tok2 tok3"


def test_drop_non_stream(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("mindie")
    with pytest.raises(httpx.RemoteProtocolError):
        srv.post("/v1/chat/completions", chat("x [mock:drop]"))


def test_stall_mid_stream(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("mindie")
    received: list[str] = []
    body = chat("x [mock:chunks=10,stall=2]", stream=True)
    with pytest.raises(httpx.ReadTimeout), \
            srv.client.stream("POST", "/v1/chat/completions", json=body, timeout=0.5) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: "):
                received.append(line)
    assert len(received) == 3  # role chunk + 2 pieces
    assert srv.wait_stats(lambda s: s["disconnects"] == 1)["disconnects"] == 1


def test_directive_parsing() -> None:
    sc = parse("a [mock:chunks=5] b [MOCK:Think][mock:code=701, status=402] [mock:]")
    assert sc.flags == {"chunks": "5", "think": "", "code": "701", "status": "402"}
    assert sc.num("chunks") == 5 and sc.num("missing", 7) == 7 and sc.has("think")
    assert parse("no directives").flags == {}
    body = {"messages": [{"role": "user", "content": "[mock:hang]"}, {"role": "assistant", "content": "x"},
                         {"role": "user", "content": [{"type": "text", "text": "[mock:"},
                                                      {"type": "text", "text": "drop=2]"}]}]}
    assert from_chat(body).flags == {"drop": "2"}
    assert from_chat({"messages": "nonsense"}).flags == {}
    assert from_prompt({"prompt": ["a", "[mock:chunks=3]"]}).flags == {"chunks": "3"}


@pytest.mark.parametrize("dialect", CHAT_MOCKS)
def test_default_reply_is_multibyte_and_deterministic(mock_servers: Any, dialect: str) -> None:
    srv: MockServer = mock_servers(dialect)
    path, body = request_for(dialect, "hi")
    first = srv.post(path, body).json()
    second = srv.post(path, body).json()
    text = first["choices"][0]["message"]["content"]
    assert text == f"Hello from the mock {dialect} upstream! 你好, 世界 🌍."
    assert second["choices"][0]["message"]["content"] == text
    assert first["usage"] == second["usage"]
    assert first["usage"]["completion_tokens"] == 13


@pytest.mark.parametrize("dialect", CHAT_MOCKS)
def test_stream_joins_to_default_reply(mock_servers: Any, dialect: str) -> None:
    srv: MockServer = mock_servers(dialect)
    path, body = request_for(dialect, "hi", stream=True)
    resp, events = srv.stream(path, body)
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert events[-1] == "[DONE]"
    text = "".join(c["delta"].get("content") or "" for e in events if isinstance(e, dict) for c in e["choices"])
    assert text == f"Hello from the mock {dialect} upstream! 你好, 世界 🌍."


CONTENT_DIRECTIVES = ["", "think", "think_close_only", "think_unclosed", "think,split_tags", "reasoning_field",
                      "tool_calls", "tool_calls=2", "tool_calls_noindex", "rewrite", "split_utf8", "split_utf8_end",
                      "chunks=0", "chunks=1", "n=2", "no_finish", "bad_json", "keepalive", "extra_fields",
                      "insufficient_resource", "raw_timeout"]


@pytest.mark.parametrize("dialect", [*CHAT_MOCKS, "mindie+full_text"])
def test_every_directive_gives_a_well_formed_answer(mock_servers: Any, dialect: str) -> None:
    name, _, mode = dialect.partition("+")
    srv: MockServer = mock_servers(name, full_text=bool(mode))
    for directive in CONTENT_DIRECTIVES:
        text = f"x [mock:{directive}]" if directive else "x"
        path, body = request_for(name, text, max_tokens=100)
        if name == "mindie" and "n=2" in directive:
            body["temperature"] = 0.5
        if directive != "raw_timeout" or name not in ("mindie", "siliconstorm"):
            resp = srv.post(path, body)
            assert resp.status_code == 200, (directive, resp.text)
            assert resp.json()["choices"], directive
        body["stream"] = True
        resp, events = srv.stream(path, body)
        assert resp.status_code == 200, (directive, resp.text)
        chunks = [e for e in events if isinstance(e, dict)]
        assert chunks, directive
        if directive not in ("raw_timeout",):
            assert events[-1] == "[DONE]", directive
    assert srv.stats()["in_flight"] == 0
