"""The mock is faithful where the demo and recipes lean on it: R1-named models end their reasoning with a lone
`</think>`; `response_format` is honoured where the imitated server honours it; DeepSeek serves FIM on
/beta/completions."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["city", "days", "tags", "unit"],
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 3},
                   "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}},
                   "unit": {"enum": ["celsius", "fahrenheit"]}},
    "$defs": {"tag": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
                      "additionalProperties": False}},
}


def raw_stream(url: str, body: dict[str, Any]) -> str:
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=10) as r:
        assert r.status_code == 200
        return "".join(r.iter_text())


def contents(sse_text: str) -> str:
    out = []
    for line in sse_text.splitlines():
        if line.startswith("data: {"):
            for ch in json.loads(line[6:]).get("choices") or ():
                out.append((ch.get("delta") or {}).get("content") or "")
    return "".join(out)


@pytest.mark.parametrize("dialect", ["mindie", "siliconstorm", "openai"])
def test_r1_names_close_reasoning_with_a_lone_tag(start_mock, dialect: str) -> None:
    mock = start_mock(dialect)
    url = mock.url + "/v1/chat/completions"
    text = contents(raw_stream(url, {"model": "DeepSeek-R1", "messages": [{"role": "user", "content": "Hi"}]}))
    assert "</think>" in text and "<think>" not in text and text.index("The user greets") < text.index("</think>")
    assert text.endswith(f"Hello from the mock {dialect} upstream! 你好, 世界 🌍.")
    plain = contents(raw_stream(url, {"model": "DeepSeek-R1", "messages": [{"role": "user", "content": "Hi"}],
                                      "chat_template_kwargs": {"enable_thinking": False}}))
    assert "think>" not in plain
    assert "think>" not in contents(raw_stream(url, {"model": "DeepSeek-R1",
                                                     "messages": [{"role": "user", "content": "Hi [mock:no_think]"}]}))
    assert "think>" not in contents(raw_stream(url, {"model": "Qwen3-32B",
                                                     "messages": [{"role": "user", "content": "Hi"}]}))


def test_readme_r1_snippet_prints_the_answer(start_mock, start_proxy) -> None:
    """README's serve example: model DeepSeek-R1 behind MindIE (full text). The answer is content, not all
    reasoning."""
    proxy = start_proxy(mock=start_mock("mindie", full_text=True), full_text=True)
    got = proxy.client().chat.completions.create(model="DeepSeek-R1", messages=[{"role": "user", "content": "Hi"}])
    message = got.choices[0].message
    assert message.content == "Hello from the mock mindie upstream! 你好, 世界 🌍."
    assert "The user greets me" in message.model_extra["reasoning_content"]


class Weather(BaseModel):
    city: str
    days: int


@pytest.mark.parametrize("dialect", ["openai", "mindie"])
def test_json_schema_is_honoured(start_mock, dialect: str) -> None:
    mock = start_mock(dialect)
    body = {"model": "m", "messages": [{"role": "user", "content": "weather?"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "w", "strict": True,
                                                                       "schema": SCHEMA}}}
    answer = httpx.post(mock.url + "/v1/chat/completions", json=body, timeout=10).json()
    jsonschema.validate(json.loads(answer["choices"][0]["message"]["content"]), SCHEMA)
    streamed = json.loads(contents(raw_stream(mock.url + "/v1/chat/completions", body)))
    jsonschema.validate(streamed, SCHEMA)
    assert streamed["days"] >= 3 and streamed["unit"] == "celsius"


def test_openai_sdk_parse_against_the_openai_mock(start_mock) -> None:
    mock = start_mock("openai")
    with openai.OpenAI(base_url=mock.url + "/v1", api_key="k", max_retries=0) as client:
        got = client.chat.completions.parse(model="m", messages=[{"role": "user", "content": "weather?"}],
                                            response_format=Weather)
    assert got.choices[0].message.parsed == Weather(city="Paris", days=1)


def test_upstreams_without_structured_output_ignore_it(start_mock) -> None:
    mock = start_mock("siliconstorm")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_object"}}
    answer = httpx.post(mock.url + "/v1/chat/completions", json=body, timeout=10).json()
    assert answer["choices"][0]["message"]["content"].startswith("Hello from the mock")


def test_deepseek_json_object(start_mock) -> None:
    mock = start_mock("deepseek")
    body = {"model": "deepseek-flash", "messages": [{"role": "user", "content": "json please"}],
            "response_format": {"type": "json_object"}}
    answer = httpx.post(mock.url + "/chat/completions", json=body, timeout=10).json()
    assert isinstance(json.loads(answer["choices"][0]["message"]["content"]), dict)


def test_deepseek_fim_on_beta_completions(start_mock) -> None:
    mock = start_mock("deepseek")
    with openai.OpenAI(base_url=mock.url + "/beta", api_key="k", max_retries=0) as client:
        got = client.completions.create(model="deepseek-flash", prompt="def fib(a):", suffix="    return fib(a-1)",
                                        max_tokens=64)
        assert got.object == "text_completion" and got.choices[0].text.startswith("Hello from the mock")
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model="deepseek-flash", prompt="def fib(a):", stream=True) if c.choices)
        assert streamed == got.choices[0].text
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model="deepseek-reasoner", prompt="x")  # retired
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model="DeepSeek-R1", prompt="x")
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model="deepseek-flash", prompt="x", max_tokens=5000)


def test_deepseek_fim_through_the_proxy(start_mock, start_proxy) -> None:
    proxy = start_proxy(mock=start_mock("deepseek"))
    client = proxy.client()
    got = client.completions.create(model="deepseek-flash", prompt="def fib(a):", max_tokens=32)
    assert got.choices[0].text.startswith("Hello from the mock deepseek")
    retired = client.completions.create(model="deepseek-chat", prompt="def fib(a):", max_tokens=32)
    assert retired.model == "deepseek-chat" and retired.choices[0].text == got.choices[0].text
