"""MindIE and Siliconstorm dialects, in process: request mapping, error mapping, and the whole response path
(upstream bytes -> SSEDecoder -> upstream session -> normaliser -> chat encoder) on the spec's own transcripts."""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hub_harness import Run, complete, complete_run, request_context
from hub_harness import relay as hub_relay
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.dialects import get_dialect
from proxy.dialects.mindie import MindIEDialect
from proxy.dialects.siliconstorm import SiliconstormDialect
from proxy.errors import ClientRequestError, StreamTruncated
from proxy.hub.canonical import CHAT, COMPLETIONS, RequestContext
from proxy.hub.sse import SSEDecoder
from proxy.settings import ClientSettings, UpstreamSettings

FIXTURES = Path(__file__).parent.parent / "fixtures"
MINDIE = MindIEDialect()
SILICON = SiliconstormDialect()
FFFD = "\ufffd"
MINDIE_ONLY = ("full_text", "prefill_time", "decode_time_arr", "batch_size", "queue_wait_time")


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def ctx(
    model: str = "qwen",
    *,
    kind: str = CHAT,
    stream: bool = False,
    include_usage: bool = False,
    dialect: str = "mindie",
    **upstream: Any,
) -> RequestContext:
    up = UpstreamSettings(name="m", dialect=dialect, url="http://127.0.0.1:9", **upstream)
    return request_context(kind, model, up, stream=stream, include_usage=include_usage)


def build(body: dict[str, Any], c: RequestContext | None = None, dialect: MindIEDialect = MINDIE) -> dict[str, Any]:
    body = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}], **body}
    c = c or ctx(body["model"], stream=body.get("stream") is True)
    before = copy.deepcopy(body)
    out = dialect.build_request(body, c)
    assert body == before, "build_request must not mutate the client's body"
    return out


def refused(
    body: dict[str, Any], dialect: MindIEDialect = MINDIE, c: RequestContext | None = None
) -> ClientRequestError:
    with pytest.raises(ClientRequestError) as e:
        build(body, c, dialect)
    assert e.value.status == 400 and e.value.type == "invalid_request_error"
    return e.value


def relay(
    pieces: list[bytes], c: RequestContext, client: ClientSettings | None = None, dialect: MindIEDialect = MINDIE
) -> tuple[list[dict[str, Any]], Run]:
    """Upstream bytes, in the given pieces -> the proxy's own pipeline and chat encoder -> client chunks."""
    return hub_relay(pieces, c, dialect, client)


def visible(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """What a client can see, per choice: role, content, reasoning, tool calls (SDK-accumulated), finish; usage."""
    seen: dict[int, dict[str, Any]] = {}
    usage = None
    for chunk in chunks:
        if chunk.get("usage"):
            usage = chunk["usage"]
        for ch in chunk["choices"]:
            s = seen.setdefault(ch["index"], {"role": "", "content": "", "reasoning": "", "tools": {}, "finish": None})
            d = ch.get("delta", {})
            s["role"] += d.get("role") or ""
            s["content"] += d.get("content") or ch.get("text") or ""
            s["reasoning"] += d.get("reasoning_content") or ""
            for tc in d.get("tool_calls") or ():
                call = s["tools"].setdefault(tc["index"], {"id": "", "name": "", "arguments": ""})
                call["id"] += tc.get("id") or ""
                call["name"] += (tc.get("function") or {}).get("name") or ""
                call["arguments"] += (tc.get("function") or {}).get("arguments") or ""
            if ch.get("finish_reason"):
                s["finish"] = ch["finish_reason"]
    return {"choices": seen, "usage": usage}


def sse(*objs: Any, done: bool = True) -> bytes:
    out = b"".join(b"data: " + orjson.dumps(o) + b"\n\n" for o in objs)
    return out + (b"data: [DONE]\n\n" if done else b"")


def chunk(content: str | None = None, finish: str | None = None, index: int = 0, **top: Any) -> dict[str, Any]:
    delta: dict[str, Any] = {"role": "assistant"}
    if content is not None:
        delta["content"] = content
    for key in ("reasoning_content", "tool_calls"):
        if key in top:
            delta[key] = top.pop(key)
    return {
        "id": "endpoint_common_3",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "qwen",
        "choices": [{"index": index, "delta": delta, "finish_reason": finish}],
        **top,
    }


# ================================================================================================ requests


def test_openai_only_fields_are_renamed_dropped_or_translated() -> None:
    out = build(
        {
            "max_completion_tokens": 64,
            "stream": True,
            "stream_options": {"include_usage": True},
            "user": "u",
            "store": True,
            "metadata": {"a": "b"},
            "parallel_tool_calls": False,
            "response_format": {"type": "text"},  # asks for nothing
            "logit_bias": {},
            "modalities": ["text"],
            "service_tier": "auto",
            "verbosity": "low",
            "prompt_cache_key": "k",
            "top_k": 5,
            "repetition_penalty": 1.1,
        },
        c=ctx("qwen", stream=True),
    )
    assert out["max_tokens"] == 64 and "max_completion_tokens" not in out
    for key in (
        "stream_options",
        "user",
        "store",
        "metadata",
        "parallel_tool_calls",
        "response_format",
        "logit_bias",
        "modalities",
        "service_tier",
        "verbosity",
        "prompt_cache_key",
    ):
        assert key not in out, key
    assert out["top_k"] == 5 and out["repetition_penalty"] == 1.1 and out["stream"] is True  # MindIE's own


@pytest.mark.parametrize("dialect", [MINDIE, SILICON])
@pytest.mark.parametrize("param,value", [
    ("logit_bias", {"50256": -100}), ("modalities", ["text", "audio"]), ("audio", {"voice": "alloy"}),
    ("web_search_options", {"search_context_size": "low"}),
])
def test_parameters_mindie_cannot_honour_are_refused_by_name(dialect: MindIEDialect, param: str, value: Any) -> None:
    with pytest.raises(ClientRequestError) as e:
        build({param: value}, c=ctx(dialect=dialect.name), dialect=dialect)
    assert e.value.param == param and e.value.status == 400 and e.value.code == "unsupported_parameter"
    assert f"`{param}`" in e.value.message


@pytest.mark.parametrize("kind", ["json_object", "json_schema"])
def test_response_format_is_refused_when_rejecting_and_passed_when_configured(kind: str) -> None:
    fmt: dict[str, Any] = {"type": kind}
    if kind == "json_schema":
        fmt["json_schema"] = {"name": "w", "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}
    for dialect in (MINDIE, SILICON):
        with pytest.raises(ClientRequestError) as e:
            build({"response_format": fmt}, c=ctx(dialect=dialect.name, response_format="reject"), dialect=dialect)
        assert e.value.param == "response_format" and "response_format: pass" in e.value.message
        out = build({"response_format": fmt}, c=ctx(dialect=dialect.name, response_format="pass"), dialect=dialect)
        assert out["response_format"] == fmt
        out = build({"response_format": fmt}, c=ctx(dialect=dialect.name, response_format="drop"), dialect=dialect)
        assert "response_format" not in out
    passed = build({"response_format": {"type": "text"}}, c=ctx(response_format="pass"))
    assert passed["response_format"] == {"type": "text"}


def test_explicit_max_tokens_wins_over_max_completion_tokens() -> None:
    assert build({"max_tokens": 10, "max_completion_tokens": 99})["max_tokens"] == 10


def test_model_is_the_upstream_name_after_alias_resolution() -> None:
    c = ctx("qwen")
    c.client_model, c.upstream_model = "gpt-4o", "Qwen3-32B"
    assert build({"model": "gpt-4o"}, c)["model"] == "Qwen3-32B"


def test_developer_becomes_system_and_media_parts_become_bare_urls() -> None:
    messages = [
        {"role": "developer", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "high"}},
                {"type": "video_url", "video_url": {"url": "file:///data/multimodal_inputs/v.mp4"}},
                {"type": "image_url", "image_url": "/already/bare.png"},
            ],
        },
    ]
    out = build({"messages": messages, "tools": [{"type": "function", "function": {"name": "f"}}]})
    assert out["messages"][0] == {"role": "system", "content": "Be brief."}
    assert out["messages"][1]["content"] == [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": "https://example.com/a.png"},
        {"type": "video_url", "video_url": "file:///data/multimodal_inputs/v.mp4"},
        {"type": "image_url", "image_url": "/already/bare.png"},
    ]


@pytest.mark.parametrize(
    ("extra", "enabled"),
    [
        ({"reasoning_effort": "high"}, True),
        ({"reasoning_effort": "low"}, True),
        ({"reasoning_effort": "none"}, False),
        ({"reasoning_effort": "minimal"}, False),
        ({"thinking": {"type": "enabled"}}, True),
        ({"thinking": {"type": "disabled"}}, False),
        ({"enable_thinking": False}, False),
        ({"thinking": {"type": "disabled"}, "reasoning_effort": "high"}, False),  # DeepSeek-style wins
    ],
)
def test_thinking_switches_become_chat_template_kwargs(extra: dict[str, Any], enabled: bool) -> None:
    out = build({**extra, "chat_template_kwargs": {"other": 1}})
    assert out["chat_template_kwargs"] == {"other": 1, "enable_thinking": enabled}
    assert not {"reasoning_effort", "thinking", "enable_thinking"} & set(out)


def test_explicit_chat_template_kwargs_win_and_disabled_thinking_is_recorded() -> None:
    session = MINDIE.session(ctx("DeepSeek-R1"))
    out = session.build_request(
        {
            "model": "DeepSeek-R1",
            "messages": [{"role": "user", "content": "hi"}],
            "reasoning_effort": "high",
            "chat_template_kwargs": {"enable_thinking": False},
        }
    )
    assert out["chat_template_kwargs"] == {"enable_thinking": False}
    assert session.thinking_off is True  # a listed hybrid model then does not start inside <think>
    assert "chat_template_kwargs" not in build({})


@pytest.mark.parametrize(
    ("model", "listed", "effort", "reasoning"),
    [
        ("DeepSeek-R1", False, None, "Thinking."),
        ("DeepSeek-R1", False, "none", ""),  # switched off: MindIE's template opens no block for R1 either
        ("hybrid-v3", True, None, "Thinking."),
        ("hybrid-v3", True, "none", ""),  # switched off: no block, the text (tag and all) is the answer
        ("qwen", False, None, ""),
    ],
)
def test_starting_inside_the_thinking_block(model: str, listed: bool, effort: str | None, reasoning: str) -> None:
    session = MINDIE.session(ctx(model, stream=True, thinking_models=(model,) if listed else ()))
    session.build_request(
        {
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
            **({"reasoning_effort": effort} if effort else {}),
        }
    )
    out, _ = hub_relay([sse(chunk("Thinking.</think>\n\nHi", "stop"))], session.ctx, MINDIE, session=session)
    v = visible(out)["choices"][0]
    assert v["reasoning"] == reasoning
    assert v["content"] == ("Hi" if reasoning else "Thinking.</think>\n\nHi")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"thinking": {"type": "auto"}}, "thinking"),
        ({"enable_thinking": "yes"}, "enable_thinking"),
    ],
)
def test_bad_thinking_switches_are_refused(extra: dict[str, Any], param: str) -> None:
    assert refused(extra).param == param


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": -0.5}, "top_p"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2**31}, "max_tokens"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"n": 129, "temperature": 1}, "n"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": 2**31}, "top_k"),
        ({"temperature": "hot"}, "temperature"),
    ],
)
def test_values_mindie_would_refuse_get_a_400_naming_the_parameter(extra: dict[str, Any], param: str) -> None:
    err = refused(extra)
    assert err.param == param and f"`{param}`" in err.message


def test_values_at_the_edges_pass() -> None:
    out = build(
        {
            "temperature": 0,
            "top_p": 1,
            "max_tokens": 2**31 - 1,
            "seed": 2**64 - 1,
            "top_k": -1,
            "presence_penalty": -2,
            "frequency_penalty": 2,
            "repetition_penalty": 2,
            "n": 1,
        }
    )
    assert (out["temperature"], out["top_p"], out["max_tokens"], out["top_k"]) == (0, 1, 2**31 - 1, -1)


@pytest.mark.parametrize("top_p", [0, 0.0, 1e-7, 1e-6])
def test_top_p_openai_allows_but_mindie_does_not_is_clamped(top_p: float) -> None:
    # MindIE's range is (1e-6, 1]; OpenAI's top_p 0 means "only the most likely token", which 1e-5 also gives.
    assert build({"top_p": top_p})["top_p"] == 1e-5


def test_siliconstorm_takes_top_k_zero() -> None:
    assert build({"top_k": 0}, dialect=SILICON)["top_k"] == 0
    assert refused({"top_k": -2}, SILICON).param == "top_k"


def test_stop_limits() -> None:
    assert build({"stop": "END"})["stop"] == "END"
    assert build({"stop": ["a", "b"]})["stop"] == ["a", "b"]
    assert "stop" not in build({"stop": []})  # MindIE: an empty list means none
    assert build({"stop": ["x"] * 1024})["stop"] == ["x"] * 1024
    assert refused({"stop": ["x"] * 1025}).param == "stop"
    assert refused({"stop": ""}).param == "stop"
    assert refused({"stop": ["ok", "y" * 1025]}).param == "stop"
    assert refused({"stop": ["z" * 1000] * 33}).param == "stop"  # 33000 characters > 32768
    assert refused({"stop": 5}).param == "stop"


def test_several_answers_need_a_temperature_on_mindie() -> None:
    assert build({"n": 2})["temperature"] == 1.0  # OpenAI's default temperature, said out loud
    assert build({"n": 2, "temperature": 0.3})["temperature"] == 0.3
    assert "temperature" not in build({"n": 1})
    err = refused({"n": 3, "temperature": 0})
    assert err.param == "n" and "temperature" in err.message


def test_legacy_functions_are_refused() -> None:
    assert refused({"functions": [{"name": "f", "parameters": {}}]}).param == "functions"
    assert refused({"function_call": "auto"}).param == "function_call"


def test_completions_prompt_shapes() -> None:
    c = ctx(kind=COMPLETIONS)
    body = {"model": "qwen", "prompt": ["Once upon"], "max_completion_tokens": 5, "stream_options": {}}
    out = MINDIE.build_request(body, c)
    assert out == {"model": "qwen", "prompt": "Once upon", "max_tokens": 5}
    assert MINDIE.build_request({"model": "qwen", "prompt": [[1, 2, 3]]}, c)["prompt"] == [1, 2, 3]
    assert MINDIE.build_request({"model": "qwen", "prompt": [1, 2, 3]}, c)["prompt"] == [1, 2, 3]
    assert MINDIE.build_request({"model": "qwen", "prompt": "x", "echo": False, "suffix": None}, c) == {
        "model": "qwen",
        "prompt": "x",
    }
    for bad, param in (
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": "x", "echo": True}, "echo"),
        ({"prompt": "x", "suffix": "end"}, "suffix"),
    ):
        with pytest.raises(ClientRequestError) as e:
            MINDIE.build_request({"model": "qwen", **bad}, c)
        assert e.value.param == param


def test_req_id_header_is_unique_per_attempt_and_keeps_the_request_id() -> None:
    c = ctx()
    ids = {MINDIE.request_headers(c)["req-id"] for _ in range(50)}
    assert len(ids) == 50 and all(i.startswith("rid-") for i in ids)
    c.attempt = 1
    assert MINDIE.request_headers(c)["req-id"].startswith("rid-1")
    assert MINDIE.request_headers(c)["x-request-id"] == "rid"
    assert SILICON.request_headers(c)["req-id"].startswith("rid-")


def test_mappings_are_registered() -> None:
    assert isinstance(get_dialect("mindie"), MindIEDialect)
    assert isinstance(get_dialect("siliconstorm"), SiliconstormDialect)
    assert SILICON.mapping.error_code[701] == 402


# ================================================================================================== errors


@pytest.mark.parametrize(
    ("status", "body", "ours", "type_", "code"),
    [
        (
            422,
            {"error": "Parameter temperature must be in (0.0,2], got 3.", "error_type": "Input Validation Error"},
            400,
            "invalid_request_error",
            "invalid_parameter",
        ),
        (
            422,
            {"error": "Model not found", "error_type": "Input Validation Error"},
            404,
            "not_found_error",
            "model_not_found",
        ),
        (
            422,
            {
                "error": "Not found given model, please check modelName in config file.",
                "error_type": "Input Validation Error",
            },
            404,
            "not_found_error",
            "model_not_found",
        ),
        (404, {"error": "Not Found", "error_type": "NotFoundError"}, 404, "not_found_error", "not_found"),
        (400, {"error": "Bad Request", "error_type": "Bad Request"}, 400, "invalid_request_error", "invalid_parameter"),
        (424, {"error": "Generation failed", "error_type": "Generation Error"}, 502, "upstream_error", "bad_gateway"),
        (
            500,
            {"error": "Engine callback timeout: server tokenTimeout", "error_type": "Incomplete Generation"},
            502,
            "upstream_error",
            "bad_gateway",
        ),
        (
            503,
            {"error": "Service Unavailable", "error_type": "Service Unavailable"},
            503,
            "service_unavailable",
            "upstream_unavailable",
        ),
        (
            413,
            {"message": "Request body too large. Maximum allowed size is 40MB."},
            413,
            "invalid_request_error",
            "request_too_large",
        ),
    ],
)
@pytest.mark.parametrize("dialect", [MINDIE, SILICON], ids=["mindie", "siliconstorm"])
def test_mindie_error_bodies_become_openai_envelopes(
    status: int, body: dict[str, Any], ours: int, type_: str, code: str, dialect: MindIEDialect
) -> None:
    err = dialect.errors.from_body(status, orjson.dumps(body))
    assert (err.status, err.type, err.code) == (ours, type_, code)
    upstream_message = body.get("error") or body["message"]
    assert err.message.startswith(upstream_message)
    assert err.upstream_code == str(status)
    retry = err.response_headers().get("x-should-retry")
    assert retry == ("false" if 400 <= ours < 500 else None)


def test_validation_errors_name_their_parameter() -> None:
    def param(message: str) -> str | None:
        body = {"error": message, "error_type": "Input Validation Error"}
        return MINDIE.errors.from_body(422, orjson.dumps(body)).param

    assert param("Parameter temperature must be in (0.0,2], got 3.") == "temperature"
    assert param("Parameter [n] should be in [1, 128], got 200.") == "n"
    assert param("Parameter 'repetition_penalty' must be in (0.0, 2], got 0.") == "repetition_penalty"
    assert param("Parameter top logprobs must be in [0, 20], got 30.") == "top_logprobs"
    assert param("Input validation error: length of `stop` must be in [1, 1024], but got 0") == "stop"
    assert param("Request param contains role must be system, assistant, user or tool") is None
    assert MINDIE.errors.from_body(422, b'{"error":"Model not found","error_type":"x"}').param == "model"


def test_empty_503_and_raw_text_500() -> None:
    err = MINDIE.errors.from_body(503, b"")
    assert (err.status, err.type) == (503, "service_unavailable")
    assert "503" in err.message and "empty body" in err.message
    err = MINDIE.errors.from_body(500, b"Server internal error")
    assert (err.status, err.message) == (502, "Server internal error")


@pytest.mark.parametrize(
    ("code", "status", "type_", "err_code"),
    [
        (701, 402, "insufficient_quota", "insufficient_quota"),
        (702, 403, "permission_error", "permission_denied"),
        (801, 401, "authentication_error", "invalid_api_key"),
        (802, 504, "timeout_error", "upstream_timeout"),
        (9999, 502, "upstream_error", "bad_gateway"),
        (1234, 502, "upstream_error", "bad_gateway"),
    ],
)
@pytest.mark.parametrize("http_status", [200, 400, 500])
def test_siliconstorm_codes_whatever_the_http_status(
    code: int, status: int, type_: str, err_code: str, http_status: int
) -> None:
    body = {"code": code, "result": None, "message": f"message for {code}"}
    if http_status == 200:
        err = SILICON.errors.in_json(body)
        assert err is not None
    else:
        err = SILICON.errors.from_body(http_status, orjson.dumps(body))
    assert (err.status, err.type, err.code) == (status, type_, err_code)
    assert err.message.startswith(f"message for {code}") and str(code) in err.message
    assert err.upstream_code == str(code)
    headers = err.response_headers()
    assert headers.get("x-should-retry") == ("false" if status < 500 else None)


def test_siliconstorm_code_in_a_completion_or_a_stream_event() -> None:
    body = {"code": 701, "result": None, "message": "Insufficient balance"}
    with pytest.raises(Exception) as e:
        SILICON.session(ctx(dialect="siliconstorm")).chunk(body, whole=True)
    assert getattr(e.value, "status", None) == 402
    with pytest.raises(StreamTruncated) as t:
        SILICON.session(ctx(dialect="siliconstorm", stream=True)).chunk(dict(body))
    assert (t.value.status, t.value.type, t.value.message) == (
        402,
        "insufficient_quota",
        "Insufficient balance (Siliconstorm code 701)",
    )
    # Not errors: completions, and a success code.
    assert SILICON.errors.in_json({"code": 0, "result": {}, "message": "ok"}) is None
    assert SILICON.errors.in_json({"id": "x", "choices": [], "code": 5}) is None
    # MindIE itself does not read Siliconstorm codes.
    assert MINDIE.errors.in_json(body) is None


def test_siliconstorm_document_example_is_read_although_it_is_not_json() -> None:
    raw = fixture("siliconstorm/error-701-spec.txt")  # verbatim: "message": 'Insufficient balance'
    err = SILICON.errors.from_body(402, raw)
    assert (err.status, err.type, err.message) == (
        402,
        "insufficient_quota",
        "Insufficient balance (Siliconstorm code 701)",
    )


# ============================================================================ responses: the spec transcripts


@pytest.mark.parametrize("name", ["stream-deltas.sse", "stream-deltas-en.sse"])
def test_spec_delta_stream(name: str) -> None:
    c = ctx("deepseek", stream=True, include_usage=True)
    out, tr = relay([fixture(f"mindie/{name}")], c)
    v = visible(out)
    (choice,) = v["choices"].values()
    assert choice["role"] == "assistant"  # once: MindIE repeats it in all 18 deltas
    assert choice["content"] == "\t\t" and choice["finish"] == "stop"
    assert sum(1 for o in out for ch in o["choices"] if "role" in ch["delta"]) == 1
    # The 15 empty deltas carry nothing: not relayed. (Leading whitespace waits for what follows: it might precede a
    # <think>.) Role chunk, the finish chunk, the usage chunk.
    assert len(out) == 3
    assert out[-1]["choices"] == [] and out[-1]["usage"]["total_tokens"] == 71
    assert all(o["usage"] is None for o in out[:-1])
    assert all(o["id"] == "chatcmpl-ours" and o["model"] == "deepseek" for o in out)
    raw = orjson.dumps(out).decode()
    assert not any(key in raw for key in MINDIE_ONLY)
    if name.endswith("-en.sse"):
        assert out[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        assert tr.usage_extras["batch_size"] == [1] * 17 and len(tr.usage_extras["queue_wait_time"]) == 17


@pytest.mark.parametrize("name", ["stream-fulltext.sse", "stream-fulltext-en.sse"])
def test_spec_fulltext_stream(name: str) -> None:
    c = ctx("qwen", stream=True, full_text=True)
    out, tr = relay([fixture(f"mindie/{name}")], c)
    deltas = [ch["delta"].get("content") for o in out for ch in o["choices"]]
    assert deltas == ["Hello", "!", " How", " can", " I", " assist", " you", " today", "?", None]
    assert out[-1]["choices"][0]["finish_reason"] == "length"
    assert "usage" not in out[-1]  # no include_usage: no usage key at all
    assert tr.usage is not None and tr.usage["total_tokens"] == 41  # still known for metrics
    assert (tr.rewrites, tr.full_text_mismatch) == (0, False)
    assert "full_text" not in tr.usage_extras and "full_text" not in orjson.dumps(out).decode()


def test_fulltext_stream_ending_in_an_empty_delta_gets_its_tail_from_full_text() -> None:
    # The document: "the last response is empty". The half-decoded character is held back; full_text resolves it.
    c = ctx("qwen", stream=True, full_text=True)
    raw = sse(
        chunk("", None),
        chunk("Café au l"),
        chunk("Café au lait " + FFFD),
        chunk("", "stop", full_text="Café au lait ☕", usage={"prompt_tokens": 3, "completion_tokens": 5}),
    )
    out, tr = relay([raw], c)
    text = visible(out)["choices"][0]["content"]
    assert text == "Café au lait ☕" and FFFD not in text
    assert tr.full_text_mismatch is False


def test_fulltext_mismatch_is_reported_not_forwarded() -> None:
    c = ctx("qwen", stream=True, full_text=True)
    raw = sse(chunk("Hello STOP"), chunk("Hello STOP", "stop", full_text="Hello"))
    out, tr = relay([raw], c)
    assert visible(out)["choices"][0]["content"] == "Hello STOP"  # sent text cannot be taken back
    assert tr.full_text_mismatch is True


def test_full_text_of_one_choice_is_not_used_for_the_next() -> None:
    c = ctx("qwen", stream=True, full_text=True)
    raw = sse(
        chunk("ab", index=0),
        chunk("xy", index=1),
        chunk("abc", "stop", index=0, full_text="abc"),
        chunk("xyz", "stop", index=1),
    )
    out, _ = relay([raw], c)
    choices = visible(out)["choices"]
    assert (choices[0]["content"], choices[1]["content"]) == ("abc", "xyz")


def test_reasoning_content_is_a_true_delta_in_fulltext_mode() -> None:
    c = ctx("qwen", stream=True, full_text=True)
    raw = sse(
        chunk("", reasoning_content="Think"),
        chunk(None, reasoning_content="ing."),
        chunk("An"),
        chunk("Answer", "stop", full_text="Answer"),
    )
    out, _ = relay([raw], c)
    v = visible(out)["choices"][0]
    assert (v["reasoning"], v["content"]) == ("Thinking.", "Answer")


def test_upstream_id_kept_only_when_configured() -> None:
    raw = fixture("mindie/stream-deltas.sse")
    out, _ = relay([raw], ctx(stream=True))
    assert {o["id"] for o in out} == {"chatcmpl-ours"}
    out, _ = relay([raw], ctx(stream=True, keep_upstream_id=True))
    assert {o["id"] for o in out} == {"endpoint_common_8"}
    data = json.loads(fixture("mindie/nonstream-multi-turn-1.json"))
    c = ctx(keep_upstream_id=True)
    assert complete(data, c, MINDIE)["id"] == "endpoint_common_16"


def completion(name: str, spoke: MindIEDialect = MINDIE, **kw: Any) -> tuple[dict[str, Any], Run]:
    c = ctx(**kw)
    data = json.loads(fixture(name))
    return complete_run(data, c, spoke)


def test_spec_non_stream_answers() -> None:
    out, run = completion("mindie/nonstream-multi-turn-1.json")
    message = out["choices"][0]["message"]
    assert message == {
        "role": "assistant",
        "content": (
            "The best city in China is subjective and depends on personal preferences, but **Shanghai** is often "
            "considered one of the most vibrant and dynamic cities in the country."
        ),
        "refusal": None,  # required (nullable) in OpenAI's schema
        "annotations": [],
    }  # tool_calls: [] dropped
    assert out["usage"] == {
        "prompt_tokens": 45,
        "completion_tokens": 54,
        "total_tokens": 78,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert out["id"] == "chatcmpl-ours" and out["model"] == "qwen"
    raw = orjson.dumps(out).decode()
    assert not any(key in raw for key in MINDIE_ONLY)
    assert run.usage_extras["prefill_time"] == 39 and len(run.usage_extras["decode_time_arr"]) == 33

    out, _ = completion("mindie/nonstream-single-turn.json")
    assert out["choices"][0]["message"]["content"] == "\n\nHello there, how may I assist you today?"
    out, _ = completion("mindie/nonstream-multi-turn-2.json")
    assert out["choices"][0]["finish_reason"] == "length"


def test_spec_tool_call_answers() -> None:
    out, _ = completion("siliconstorm/nonstream-tool-calls.json", SILICON, dialect="siliconstorm")
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None  # "" with tool calls -> null, as OpenAI does
    assert choice["message"]["tool_calls"] == [
        {
            "function": {"arguments": '{"order_id": "12345"}', "name": "get_delivery_date"},
            "id": "call_JwmTNF3O",
            "type": "function",
        }
    ]
    out, _ = completion("siliconstorm/nonstream-tool-calls-null.json", SILICON, dialect="siliconstorm")
    assert "tool_calls" not in out["choices"][0]["message"]


def test_non_stream_usage_keeps_cached_and_reasoning_tokens() -> None:
    c = ctx()
    data = {
        "id": "endpoint_common_1",
        "object": "chat.completion",
        "created": 1,
        "model": "qwen",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "<think>hmm</think>\n\nok", "tool_calls": []},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 9,
            "prompt_tokens_details": {"cached_tokens": 4},
            "completion_tokens": 5,
            "completion_tokens_details": {"reasoning_tokens": 2},
            "total_tokens": 14,
            "batch_size": [1] * 5,
            "queue_wait_time": [9] * 5,
        },
        "prefill_time": 1,
        "decode_time_arr": [1] * 4,
    }
    out = complete(data, c, MINDIE)
    assert out["usage"]["prompt_tokens_details"] == {"cached_tokens": 4}
    assert out["usage"]["completion_tokens_details"] == {"reasoning_tokens": 2}
    assert "batch_size" not in out["usage"] and "queue_wait_time" not in out["usage"]
    assert out["choices"][0]["message"] == {"role": "assistant", "content": "ok", "reasoning_content": "hmm",
                                            "refusal": None, "annotations": []}


def test_streamed_tool_calls_without_index() -> None:
    c = ctx(stream=True)
    first = {"id": "call_a", "type": "function", "function": {"name": "get_weather"}}
    raw = sse(
        chunk(""),
        chunk(tool_calls=[first]),
        chunk(tool_calls=[{"function": {"arguments": '{"city": '}}]),
        chunk(tool_calls=[{"function": {"arguments": '"Paris"}'}}]),
        chunk(tool_calls=[{"id": "call_b", "type": "function", "function": {"name": "get_time"}}]),
        chunk(None, "tool_calls", tool_calls=[{"function": {"arguments": "{}"}}]),
    )
    out, _ = relay([raw], c)
    for o in out:
        for ch in o["choices"]:
            for tc in ch["delta"].get("tool_calls") or ():
                assert isinstance(tc["index"], int)
    v = visible(out)["choices"][0]
    assert v["tools"] == {
        0: {"id": "call_a", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        1: {"id": "call_b", "name": "get_time", "arguments": "{}"},
    }
    assert v["finish"] == "tool_calls" and v["role"] == "assistant"


def test_stream_truncations_raise() -> None:
    c = ctx(stream=True)
    with pytest.raises(StreamTruncated):  # closed without [DONE]
        relay([sse(chunk("Hel"), done=False)], c)
    with pytest.raises(StreamTruncated):  # [DONE] but never a finish_reason
        relay([sse(chunk("Hel"), chunk("lo"))], ctx(stream=True))
    # Raw bytes after the 200 (MindIE's engine timeout) are reported by the SSE decoder, never ignored.
    dec = SSEDecoder()
    events = dec.feed(sse(chunk("Hel"), done=False) + b"Engine callback timeout: server tokenTimeout") + dec.flush()
    assert events[-1].garbage == "Engine callback timeout: server tokenTimeout"


# ===================================================================== chunk-boundary invariance (hypothesis)

REASONING = "Let me think: 2+2. 先想一想 🤔 <b>ok</b>"
ANSWER = "The answer is 4. 你好, 世界 🌍."


def mindie_transcript(
    reasoning: str, content: str, cuts: list[int], *, full_text: bool, inline: str, fffd_at: set[int]
) -> bytes:
    """A MindIE stream as the server writes it: role repeated in every delta, usage on the finish chunk, `full_text`
    on it in full-text mode. inline: "think" (<think>…</think>), "close_only" (…</think>), "field"
    (reasoning_content deltas) or "none". `fffd_at`: snapshot indices that end in a half-decoded character."""
    chunks = [chunk("")]
    if inline == "field":
        for piece in _pieces(reasoning, cuts):
            chunks.append(chunk(None, reasoning_content=piece))
        text = content
    elif inline == "think":
        text = f"<think>{reasoning}</think>\n\n{content}"
    elif inline == "close_only":
        text = f"{reasoning}</think>\n\n{content}"
    else:
        text = content
    bounds = sorted({0, *[min(c, len(text)) for c in cuts], len(text)})
    previous = 0
    for i, end in enumerate(bounds[1:]):
        if full_text:
            snapshot = text[:end]
            if i in fffd_at and end < len(text):
                snapshot = text[: end - 1] + FFFD if end - 1 > previous else text[:end]
                chunks.append(chunk(snapshot))
                snapshot = text[:end]
            chunks.append(chunk(snapshot))
            chunks.append(chunk(snapshot))  # repeated identical snapshots emit nothing
        else:
            chunks.append(chunk(text[previous:end]))
        previous = end
    last = chunk(
        text if full_text else "",
        "stop",
        usage={"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12, "batch_size": [1] * 9},
    )
    if full_text:
        last = {**last, "full_text": text}
    chunks.append(last)
    return sse(*chunks)


def _pieces(text: str, cuts: list[int]) -> list[str]:
    bounds = sorted({0, *[min(c, len(text)) for c in cuts], len(text)})
    return [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def client_view(raw: bytes, cuts: list[int], c: RequestContext) -> dict[str, Any]:
    cuts = sorted({min(max(x, 0), len(raw)) for x in cuts})
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=False)]
    out, _ = relay(pieces, c)
    roles = sum(1 for o in out for ch in o["choices"] if "role" in ch["delta"])
    assert roles == 1
    assert all(FFFD not in (ch["delta"].get("content") or "") for o in out for ch in o["choices"])
    return visible(out)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(0, 80), max_size=12),
    st.lists(st.integers(0, 4000), max_size=25),
    st.booleans(),
    st.sampled_from(["think", "close_only", "field", "none"]),
    st.sets(st.integers(0, 12), max_size=4),
)
def test_cutting_the_upstream_bytes_anywhere_gives_the_same_client_text(
    text_cuts: list[int],
    byte_cuts: list[int],
    full_text: bool,
    inline: str,
    fffd_at: set[int],
) -> None:
    model = "DeepSeek-R1-Distill" if inline == "close_only" else "Qwen3-32B"
    raw = mindie_transcript(REASONING, ANSWER, text_cuts, full_text=full_text, inline=inline, fffd_at=fffd_at)
    whole = client_view(raw, [], ctx(model, stream=True, include_usage=True, full_text=full_text))
    cut = client_view(raw, byte_cuts, ctx(model, stream=True, include_usage=True, full_text=full_text))
    assert cut == whole
    choice = whole["choices"][0]
    expect_reasoning = "" if inline == "none" else REASONING
    assert (choice["reasoning"], choice["content"], choice["finish"]) == (expect_reasoning, ANSWER, "stop")
    assert whole["usage"] == {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3000), max_size=20))
def test_spec_transcripts_are_cut_invariant(byte_cuts: list[int]) -> None:
    for name, full in (
        ("stream-fulltext.sse", True),
        ("stream-fulltext-en.sse", True),
        ("stream-deltas.sse", False),
        ("stream-deltas-en.sse", False),
    ):
        raw = fixture(f"mindie/{name}")
        c = {"stream": True, "include_usage": True, "full_text": full}
        assert client_view(raw, byte_cuts, ctx(**c)) == client_view(raw, [], ctx(**c)), name


# ===================================================================== thinking switch and replay per model
@pytest.mark.parametrize(("model", "key"), [("Qwen3-32B", "enable_thinking"), ("DeepSeek-V3.2-Exp", "thinking"),
                                            ("deepseek-v3.1", "thinking"), ("GLM-4.6", "enable_thinking")])
def test_thinking_switch_uses_the_models_template_kwarg(model: str, key: str) -> None:
    up = UpstreamSettings(name="mi", dialect="mindie", url="http://127.0.0.1:9")
    c = request_context(CHAT, model, up)
    session = get_dialect("mindie").session(c)
    out = session.build_request({"model": model, "messages": [{"role": "user", "content": "hi"}],
                                 "reasoning_effort": "none"})
    assert out["chat_template_kwargs"] == {key: False} and session.thinking_off


@pytest.mark.parametrize(("model", "mode"), [("Qwen3-32B", "restore"), ("DeepSeek-V3.2", "restore"),
                                             ("DeepSeek-R1", "strip"), ("Llama-3-70B", "keep")])
def test_auto_replay_per_model(model: str, mode: str) -> None:
    up = UpstreamSettings(name="mi", dialect="mindie", url="http://127.0.0.1:9")
    c = request_context(CHAT, model, up)
    assert get_dialect("mindie").reasoning_replay({"model": model, "messages": []}, c) == mode


def test_timing_lists_are_passed_on_unread_with_their_units() -> None:
    """proxy/dialects/mindie.py `timings`: each list (top level or in `usage`) goes to the metrics layer as MindIE
    sent it, with its unit (proxy/hub/readings.py reads it); a field that is not a list is no timing."""
    from proxy.dialects import mindie
    from proxy.hub.events import Timings
    from proxy.hub.readings import Readings

    decode = [12, "x", 13.5]
    t = MindIEDialect().timings({"prefill_time": 40, "decode_time_arr": decode,
                                 "usage": {"queue_wait_time": [250], "batch_size": "3", "decode_time_arr": [1]}})
    assert t is not None
    assert t.prefill == pytest.approx(0.040)
    assert t.decode == Readings(decode, mindie.DECODE_TIME_UNIT) and t.decode.items is decode  # top level first
    assert t.queue_wait == Readings([250], mindie.QUEUE_WAIT_TIME_UNIT)
    assert t.batch_size is None
    assert MindIEDialect().timings({"prefill_time": "fast", "decode_time_arr": "1,2", "usage": None}) is None
    assert MindIEDialect().timings({"usage": {"batch_size": []}}) == Timings(batch_size=Readings([], 1.0))
