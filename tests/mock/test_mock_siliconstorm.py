"""The mock Siliconstorm (hosted MindIE): its own error codes, its usage and tool_calls shapes."""

from __future__ import annotations

from typing import Any

import pytest
from mockutil import MockServer, chat

PATH = "/v1/chat/completions"


@pytest.mark.parametrize(("code", "message"), [(701, "Insufficient balance"), (702, "Authorization not passed"),
                                               (801, "Apikey error"), (802, "Request timeout"),
                                               (9999, "Model response exception")])
@pytest.mark.parametrize("stream", [False, True])
def test_code_errors_arrive_with_http_200(mock_servers: Any, code: int, message: str, stream: bool) -> None:
    srv: MockServer = mock_servers("siliconstorm")
    resp = srv.post(PATH, chat(f"x [mock:code={code}]", stream=stream))
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "application/json"  # no SSE, even for stream: true
    assert resp.json() == {"code": code, "result": None, "message": message}


def test_code_with_status_override(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("siliconstorm")
    for text in ("x [mock:code=701,status=402]", "x [mock:code=701][mock:status=402]"):
        resp = srv.post(PATH, chat(text))
        assert resp.status_code == 402 and resp.json()["code"] == 701


def test_api_key_gets_code_801(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("siliconstorm", api_key="sk-sil")
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        resp = srv.post(PATH, chat(stream=True), headers=headers)
        assert resp.status_code == 200 and resp.json() == {"code": 801, "result": None, "message": "Apikey error"}
    assert srv.post(PATH, chat(), headers={"Authorization": "Bearer sk-sil"}).json()["object"] == "chat.completion"


def test_shapes(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("siliconstorm")
    body = srv.post(PATH, chat(model="DeepSeek-R1", top_k=0)).json()
    assert body["id"].startswith("endpoint_common_")
    assert body["choices"][0]["message"]["tool_calls"] is None
    assert set(body["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert "prefill_time" in body and "decode_time_arr" in body
    _, events = srv.stream(PATH, chat(stream=True))
    chunks = [e for e in events if isinstance(e, dict)]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert set(chunks[-1]["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and events[-1] == "[DONE]"


def test_full_text_and_mindie_errors(mock_servers: Any) -> None:
    srv: MockServer = mock_servers("siliconstorm", full_text=True)
    _, events = srv.stream(PATH, chat("x [mock:chunks=3]", stream=True))
    chunks = [e for e in events if isinstance(e, dict)]
    assert [c["choices"][0]["delta"]["content"] for c in chunks] == ["", "tok0", "tok0 tok1", "tok0 tok1 tok2"]
    assert chunks[-1]["full_text"] == "tok0 tok1 tok2"
    resp = srv.post(PATH, chat(temperature=9))
    assert resp.status_code == 422 and resp.json()["error_type"] == "Input Validation Error"
    assert srv.post(PATH, chat("x [mock:error=503]")).status_code == 503
