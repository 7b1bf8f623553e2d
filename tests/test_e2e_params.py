"""Parameters an upstream cannot honour are never silently dropped (proxy/hub/params.py): `response_format` per upstream
(`response_format: pass | reject | drop`), and the mappings' `refuse` lists. Real mock upstreams and proxies on
loopback, driven by the openai SDK (structured outputs with `parse()`), LangChain and the anthropic SDK."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import jsonschema
import openai
import pytest
from pydantic import BaseModel

SAY = [{"role": "user", "content": "Weather in Paris for the next days?"}]
SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
                          "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 2}}}


class Forecast(BaseModel):
    city: str
    days: int


@pytest.mark.parametrize("dialect", ["mindie", "openai"])
@pytest.mark.parametrize("stream", [False, True])
def test_structured_output_end_to_end_where_the_upstream_honours_it(start_mock, start_proxy, dialect: str,
                                                                     stream: bool) -> None:
    """MindIE >= 2.3 (`response_format: pass`) and OpenAI-compatible servers: the SDK's parse() gets its object."""
    mock = start_mock(dialect, full_text=dialect == "mindie")
    proxy = start_proxy(mock=mock, full_text=dialect == "mindie",
                        **({"response_format": "pass"} if dialect == "mindie" else {}))
    client = proxy.client()
    if stream:
        with client.chat.completions.stream(model="Qwen3-32B", messages=SAY, response_format=Forecast) as events:
            final = events.get_final_completion()
        parsed = final.choices[0].message.parsed
    else:
        parsed = client.chat.completions.parse(model="Qwen3-32B", messages=SAY, response_format=Forecast) \
            .choices[0].message.parsed
    assert parsed == Forecast(city="Paris", days=1)
    assert mock.last_request()["body"]["response_format"]["type"] == "json_schema"
    raw = client.chat.completions.create(model="Qwen3-32B", messages=SAY, response_format={
        "type": "json_schema", "json_schema": {"name": "f", "strict": True, "schema": SCHEMA}})
    jsonschema.validate(json.loads(raw.choices[0].message.content or ""), SCHEMA)


@pytest.mark.parametrize("dialect", ["mindie", "siliconstorm"])
def test_response_format_is_a_400_for_mindie_when_rejecting(start_mock, start_proxy, dialect: str) -> None:
    """`response_format: reject` (the default is `emulate`: tests/test_e2e_structured.py)."""
    mock = start_mock(dialect)
    proxy = start_proxy(mock=mock, response_format="reject")
    client = proxy.client()
    before = mock.stats()["requests"]
    for fmt in ({"type": "json_object"},
                {"type": "json_schema", "json_schema": {"name": "f", "schema": SCHEMA}}):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="m", messages=SAY, response_format=fmt)  # type: ignore[arg-type]
        err = e.value.body
        assert isinstance(err, dict) and err["param"] == "response_format" and err["code"] == "unsupported_parameter"
        assert "response_format: pass" in err["message"] and e.value.response.headers["x-should-retry"] == "false"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.parse(model="m", messages=SAY, response_format=Forecast)
    assert mock.stats()["requests"] == before, "refused before reaching the upstream"
    plain = client.chat.completions.create(model="m", messages=SAY, response_format={"type": "text"})
    assert plain.choices[0].message.content and "response_format" not in mock.last_request()["body"]


def test_response_format_setting_from_the_command_line_form(start_mock) -> None:
    """--upstream-response-format / DIALECT_PROXY_UPSTREAM_RESPONSE_FORMAT reach the settings of the single-upstream
    form, and --models / --aliases route and list as a config file's models and aliases would."""
    from proxy.__main__ import parser, settings_from_args

    args = parser().parse_args(["serve", "--upstream-url", "http://127.0.0.1:1025", "--upstream-dialect", "MindIE",
                                "--models", "Qwen3-32B, DeepSeek-R1", "--aliases", "gpt-4o=DeepSeek-R1"])
    settings = settings_from_args(args, {"DIALECT_PROXY_UPSTREAM_RESPONSE_FORMAT": "pass"})
    (up,) = settings.upstreams
    assert up.response_format == "pass" and up.dialect == "mindie"
    assert up.models == ("Qwen3-32B", "DeepSeek-R1") and dict(up.aliases) == {"gpt-4o": "DeepSeek-R1"}


def test_deepseek_json_object_passes_and_json_schema_is_emulated(start_mock, start_proxy) -> None:
    mock = start_mock("deepseek")
    client = start_proxy(mock=mock).client()
    got = client.chat.completions.create(model="deepseek-flash", messages=SAY, response_format={"type": "json_object"},
                                         extra_body={"thinking": {"type": "disabled"}})
    assert isinstance(json.loads(got.choices[0].message.content or ""), dict)
    assert mock.last_request()["body"]["response_format"] == {"type": "json_object"}
    parsed = client.chat.completions.parse(model="deepseek-flash", messages=SAY, response_format=Forecast)
    assert isinstance(parsed.choices[0].message.parsed, Forecast)
    assert "response_format" not in mock.last_request()["body"]


@pytest.mark.parametrize("param,value", [
    ("logit_bias", {"50256": -100}), ("modalities", ["text", "audio"]),
    ("audio", {"voice": "alloy", "format": "wav"}), ("web_search_options", {}),
])
def test_mindie_refuses_what_it_cannot_honour(start_mock, start_proxy, param: str, value: Any) -> None:
    mock = start_mock("mindie")
    client = start_proxy(mock=mock).client()
    if value == {}:  # asks for nothing: left out, the request goes through
        client.chat.completions.create(model="m", messages=SAY, extra_body={param: value})
        assert param not in mock.last_request()["body"]
        return
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=SAY, extra_body={param: value})
    assert e.value.body["param"] == param and e.value.body["code"] == "unsupported_parameter"  # type: ignore[index]


def test_what_clients_send_by_default_still_works_against_mindie(start_mock, start_proxy) -> None:
    """The ignorable fields SDKs and agents send (user, store, metadata, parallel_tool_calls, verbosity,
    prompt_cache_key, modalities ["text"]) are left out without a 400."""
    mock = start_mock("mindie")
    proxy = start_proxy(mock=mock)
    got = proxy.client().chat.completions.create(
        model="m", messages=SAY, user="u", store=False, metadata={"k": "v"}, parallel_tool_calls=False,
        modalities=["text"], tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        extra_body={"verbosity": "low", "prompt_cache_key": "k", "logit_bias": {}})
    assert got.choices[0].message.content
    body = mock.last_request()["body"]
    for key in ("user", "store", "metadata", "parallel_tool_calls", "modalities", "verbosity", "prompt_cache_key",
                "logit_bias"):
        assert key not in body, key


def test_anthropic_output_format_is_refused_by_name_and_passed_when_configured(start_mock, start_proxy) -> None:
    mock = start_mock("mindie")
    refusing = start_proxy(mock=mock, response_format="reject")
    passing = start_proxy(mock=mock, response_format="pass")
    body: dict[str, Any] = {"model": "m", "max_tokens": 64, "messages": SAY,
                            "extra_body": {"output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}}
    with anthropic.Anthropic(base_url=refusing.url, api_key="k", max_retries=0) as client:
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(**body)
        assert "response_format" in str(e.value)
    with anthropic.Anthropic(base_url=passing.url, api_key="k", max_retries=0) as client:
        got = client.messages.create(**body)
    text = "".join(b.text for b in got.content if b.type == "text")
    jsonschema.validate(json.loads(text), SCHEMA)
