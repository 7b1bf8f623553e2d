"""Hostile client bodies (issue 12, defects 1 and 9): a wrong type anywhere in a known field is a 400 that names the
parameter, never a 500; JSON nested too deep is a 400 before anything serialises it. One proxy on loopback in front of
one mock per upstream dialect (routed by model name); the fuzz test throws random values at the known fields."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from proxy.clients.chat import CHAT_FIELDS, COMPLETIONS_FIELDS
from proxy.clients.responses import RESPONSES_FIELDS
from proxy.dialects import DIALECTS as SPOKES
from proxy.mock import DIALECTS as MOCKS
from proxy.mock import create_app as create_mock_app
from proxy.server.app import create_app
from proxy.server.frontend import frontend_options
from proxy.settings import build_settings
from tests.conftest import running

# ------------------------------------------------------------------------------------------------- the servers

DIALECTS = tuple(d for d in MOCKS if SPOKES[d]().path("chat"))  # the chat upstreams (TEI serves retrieval alone)


class Front(httpx.Client):
    mocks: dict[str, str]
    side: httpx.Client  # for the mocks' own endpoints

    def upstream_requests(self, dialect: str) -> int:
        count: int = self.side.get(self.mocks[dialect] + "/_mock/stats").json()["requests"]
        return count


@pytest.fixture(scope="module")
def proxy_all():
    with contextlib.ExitStack() as stack:
        upstreams = []
        mocks = {}
        for dialect in DIALECTS:
            mock = stack.enter_context(running(create_mock_app(dialect)))
            mocks[dialect] = mock.url
            upstreams.append({"name": f"up-{dialect}", "dialect": dialect, "url": mock.url,
                              "models": [f"m-{dialect}"]})
        settings = build_settings(config={"upstreams": upstreams}, environ={})
        proxy = stack.enter_context(running(create_app(settings), **frontend_options(settings.server)))
        client = stack.enter_context(Front(base_url=proxy.url, timeout=30))
        client.mocks = mocks
        client.side = stack.enter_context(httpx.Client(timeout=5))
        yield client


def post(client: httpx.Client, path: str, body: Any) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(path, content=raw, headers={"content-type": "application/json"})


def chat(model: str = "m-openai", **kw: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **kw}


def assert_400_naming(resp: httpx.Response, param: str) -> None:
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param, err
    assert param in err["message"]


# ------------------------------------------------------------------------------------- the reported cases


@pytest.mark.parametrize("value", ["x", 1, [], True])
def test_stream_options_of_the_wrong_type_is_400(proxy_all, value):
    for dialect in DIALECTS:
        resp = post(proxy_all, "/v1/chat/completions", chat(f"m-{dialect}", stream=True, stream_options=value))
        assert_400_naming(resp, "stream_options")


def test_include_usage_of_the_wrong_type_is_400(proxy_all):
    resp = post(proxy_all, "/v1/chat/completions", chat(stream=True, stream_options={"include_usage": "yes"}))
    assert_400_naming(resp, "stream_options.include_usage")


@pytest.mark.parametrize("dialect", ["mindie", "siliconstorm"])
@pytest.mark.parametrize("value", [["high"], {"level": "high"}, 3])
def test_reasoning_effort_not_a_string_is_400(proxy_all, dialect, value):
    resp = post(proxy_all, "/v1/chat/completions", chat(f"m-{dialect}", reasoning_effort=value))
    assert_400_naming(resp, "reasoning_effort")


@pytest.mark.parametrize("value", ["yes", "true", 1, {}])
def test_stream_not_a_boolean_is_400(proxy_all, value):
    resp = post(proxy_all, "/v1/chat/completions", chat(stream=value))
    assert_400_naming(resp, "stream")
    resp = post(proxy_all, "/v1/completions", {"model": "m-openai", "prompt": "hi", "stream": value})
    assert_400_naming(resp, "stream")


def test_nested_field_names_its_full_path(proxy_all):
    body = chat(messages=[{"role": "user", "content": "a"}, {"role": 7, "content": "b"}])
    assert_400_naming(post(proxy_all, "/v1/chat/completions", body), "messages[1].role")
    body = chat(tools=[{"type": "function", "function": {"name": ["f"]}}])
    assert_400_naming(post(proxy_all, "/v1/chat/completions", body), "tools[0].function.name")


@pytest.mark.parametrize("depth", [65, 254, 255, 600, 1000])
def test_deep_json_is_400_not_500(proxy_all, depth):
    nested = "[" * depth + "]" * depth
    raw = ('{"model": "m-openai", "messages": [{"role": "user", "content": "hi"}], "metadata": {"x": '
           + nested + "}}").encode()
    resp = post(proxy_all, "/v1/chat/completions", raw)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "invalid_json"
    assert "64" in resp.json()["error"]["message"]


def test_json_deeper_than_orjson_parses_is_400(proxy_all):
    raw = b'{"model": "m-openai", "x": ' + b"[" * 1100 + b"]" * 1100 + b"}"
    resp = post(proxy_all, "/v1/chat/completions", raw)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_json"


def test_depth_within_the_limit_is_served(proxy_all):
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(20):  # a tool schema nested 20 objects deep (~60 JSON levels with the envelope)
        schema = {"type": "object", "properties": {"a": schema}}
    body = chat(tools=[{"type": "function", "function": {"name": "f", "parameters": schema}}])
    resp = post(proxy_all, "/v1/chat/completions", body)
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("levels,status", [(64, 200), (65, 400)])
def test_large_body_at_the_depth_limit(proxy_all, levels, status):
    """A body above proxy/clients/validate.py's SMALL_BODY (bounded by orjson's pass, not the walk): 64 levels are
    served, 65 refused."""
    value: Any = "x"
    for _ in range(levels - 5):  # the body, tools, the tool, function and parameters are five levels
        value = [value]
    body = chat(messages=[{"role": "user", "content": "hi " * 600}],
                tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "x": value}}}])
    resp = post(proxy_all, "/v1/chat/completions", body)
    assert resp.status_code == status, resp.text
    if status == 400:
        assert resp.json()["error"]["code"] == "invalid_json"


# --------------------------------------------------------------------------------------------------- the fuzzer

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12),
)
_json = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8,
)


def _set_path(body: dict[str, Any], path: str, value: Any) -> None:
    """Put `value` at a table path (`messages[].content[].type`), creating what is missing on the way."""
    parts = path.replace("[]", ".[]").split(".")
    node: Any = body
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "[]":
            if not isinstance(node, list):
                return
            if not node:
                node.append({} if not last else value)
            if last:
                node[0] = value
                return
            node = node[0]
            continue
        if not isinstance(node, dict):
            return
        if last:
            node[part] = value
            return
        nxt = "[]" if parts[i + 1] == "[]" else "{}"
        if not isinstance(node.get(part), (list if nxt == "[]" else dict)):
            node[part] = [] if nxt == "[]" else {}
        node = node[part]


_BY_TYPE: dict[str, st.SearchStrategy[Any]] = {
    "null": st.none(),
    "boolean": st.booleans(),
    "integer": st.integers(-(2**70), 2**70),
    "number": st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer()),
    "string": st.text(max_size=12),
    "array": st.lists(_json, max_size=3),
    "object": st.dictionaries(st.text(max_size=6), _json, max_size=3),
}


def _wrong_type(spec: Any) -> st.SearchStrategy[Any]:
    """A value of a JSON type the table does not allow for the field."""
    allowed = {spec} if isinstance(spec, str) else set(spec)
    if "number" in allowed:
        allowed.add("integer")
    return st.one_of([strategy for kind, strategy in _BY_TYPE.items() if kind not in allowed])


@st.composite
def _mutations(draw: Any, fields: dict[str, Any]) -> list[tuple[str, Any, bool]]:
    """1 to 3 fields of the table changed: each to a value of a wrong type (flagged True), or to any JSON value.
    Top-level fields are drawn twice as often as nested ones."""
    top = sorted(p for p in fields if "." not in p and "[" not in p)
    nested = sorted(p for p in fields if p not in top)
    out = []
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.one_of(st.sampled_from(top), st.sampled_from(top), st.sampled_from(nested)))
        wrong = draw(st.booleans())
        out.append((path, draw(_wrong_type(fields[path]) if wrong else _json), wrong))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          database=None)
@given(dialect=st.sampled_from(DIALECTS), completions=st.booleans(), stream=st.sampled_from([True, True, False]),
       chat_mut=_mutations(CHAT_FIELDS), prompt_mut=_mutations(COMPLETIONS_FIELDS))
def test_fuzzed_bodies_never_get_a_500(proxy_all, dialect, completions, stream, chat_mut, prompt_mut):
    assume(not (completions and dialect == "deepseek"))  # the DeepSeek mock has no /beta/completions
    if completions:
        path = "/v1/completions"
        body: dict[str, Any] = {"model": f"m-{dialect}", "prompt": "hi", "max_tokens": 4, "stream": stream}
        mutations = prompt_mut
    else:
        path = "/v1/chat/completions"
        body = chat(f"m-{dialect}", max_tokens=4, stream=stream)
        mutations = chat_mut
    for field_path, value, _ in mutations:
        if field_path == "model":
            continue  # routing is not under test: another model name is a 404
        _set_path(body, field_path, value)
    before = proxy_all.upstream_requests(dialect)
    resp = post(proxy_all, path, body)
    reached_upstream = proxy_all.upstream_requests(dialect) > before
    err = resp.json().get("error") if resp.status_code != 200 else None
    if not reached_upstream:
        # Refused by the proxy itself: a 400 (or 413) that names the parameter, or says the JSON is too deep.
        assert resp.status_code in (400, 413), (body, resp.text)
        assert err["param"] or err["code"] == "invalid_json", (body, err)
    else:
        # The upstream's own refusal of a well-typed value it does not take is relayed (a 4xx, or a 502 when the
        # upstream says so with a 5xx); never an internal error of ours.
        assert err is None or err["code"] != "internal_error", (body, err)
        assert resp.status_code != 500, (body, resp.text)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          database=None)
@given(dialect=st.sampled_from(DIALECTS), stream=st.booleans(), mutations=_mutations(RESPONSES_FIELDS))
def test_fuzzed_responses_bodies_never_get_a_500(proxy_all, dialect, stream, mutations):
    body: dict[str, Any] = {"model": f"m-{dialect}", "max_output_tokens": 4, "stream": stream, "store": False,
                            "input": [{"role": "user", "content": "hi"}]}
    for field_path, value, _ in mutations:
        if field_path == "model":
            continue
        _set_path(body, field_path, value)
    before = proxy_all.upstream_requests(dialect)
    resp = post(proxy_all, "/v1/responses", body)
    reached_upstream = proxy_all.upstream_requests(dialect) > before
    if resp.status_code == 200:
        return
    err = resp.json().get("error")
    if not reached_upstream:
        assert resp.status_code in (400, 404, 413), (body, resp.text)
        assert err["param"] or err["code"] in ("invalid_json", "previous_response_not_found"), (body, err)
    else:
        assert err["code"] != "internal_error" and resp.status_code != 500, (body, resp.text)
