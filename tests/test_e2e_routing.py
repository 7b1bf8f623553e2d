"""One proxy, three upstream dialects (MindIE, DeepSeek, engine), three mocks: routing by model name, /v1/models,
and the client-side options (`client.reasoning`, `client.usage_fields`) behaving identically whatever the upstream."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from proxy.mock.textgen import DEFAULT_REPLY, REASONING
from tests.conftest import Mock, ServerThread
from tests.test_e2e_deepseek import collect, one_client_start_proxy  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def mocks() -> Iterator[dict[str, Mock]]:
    from proxy.mock import create_app

    started = {d: ServerThread(create_app(d)).start() for d in ("mindie", "deepseek", "engine")}
    try:
        yield {d: Mock(srv, d) for d, srv in started.items()}
    finally:
        for srv in started.values():
            srv.stop()


def upstreams(mocks: dict[str, Mock]) -> list[dict[str, Any]]:
    return [
        {"name": "npu", "dialect": "mindie", "url": mocks["mindie"].url, "models": ["qwen-npu"]},
        {"name": "deepseek", "dialect": "deepseek", "url": mocks["deepseek"].url,
         "models": ["deepseek-chat", "deepseek-reasoner"], "aliases": {"thinker": "deepseek-reasoner"}},
        {"name": "engine", "dialect": "engine", "url": mocks["engine"].url, "models": ["engine-7b"]},
    ]


ROUTES = {"qwen-npu": ("mindie", "/v1/chat/completions", "qwen-npu"),
          # DeepSeek's retired names reach it as V4 Flash (proxy/dialects/deepseek.py)
          "deepseek-chat": ("deepseek", "/chat/completions", "deepseek-v4-flash"),
          "thinker": ("deepseek", "/chat/completions", "deepseek-v4-flash"),
          "engine-7b": ("engine", "/chat", None)}


def test_models_are_routed_by_name_and_listed(mocks, start_proxy) -> None:
    proxy = start_proxy(upstreams(mocks))
    client = proxy.client()
    http = httpx.Client(timeout=10)  # one client: a new httpx client per call costs ~40 ms of TLS setup

    def requests() -> dict[str, int]:
        return {d: http.get(m.url + "/_mock/stats").json()["requests"] for d, m in mocks.items()}

    listed = {m.id: m.owned_by for m in client.models.list()}
    assert listed == {"qwen-npu": "npu", "deepseek-chat": "deepseek", "deepseek-reasoner": "deepseek",
                      "thinker": "deepseek", "engine-7b": "engine"}
    for stream in (False, True):
        for model, (dialect, path, sent_model) in ROUTES.items():
            before = requests()
            got = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                                 stream=stream)
            if stream:
                acc = collect(got)
                content, names = acc["content"], {c.model for c in acc["chunks"]}
            else:
                content, names = got.choices[0].message.content, {got.model}
            assert content.startswith(f"Hello from the mock {dialect} upstream!"), (model, content)
            assert names == {model}
            after = requests()
            assert {d: after[d] - before[d] for d in mocks} == {d: int(d == dialect) for d in mocks}
            last = http.get(mocks[dialect].url + "/_mock/last_request").json()
            assert last["path"] == path and last["body"].get("model") == sent_model
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}])
    assert e.value.body["code"] == "model_not_found"
    http.close()


# Reasoning arrives differently from each upstream: a DeepSeek reasoner always uses `reasoning_content`; MindIE and
# the engine inline `<think>…</think>` in the content (or a field when a reasoning parser is on).
REASONING_CASES = [("deepseek-reasoner", "deepseek", "Hi"), ("engine-7b", "engine", "Hi [mock:think]"),
                   ("engine-7b", "engine", "Hi [mock:reasoning_field]"), ("qwen-npu", "mindie", "Hi [mock:think]"),
                   ("qwen-npu", "mindie", "Hi [mock:reasoning_field]")]


@pytest.mark.parametrize("mode", ["reasoning_content", "reasoning", "think_tags", "none"])
def test_client_reasoning_is_identical_for_every_upstream_dialect(mocks, start_proxy, mode) -> None:
    proxy = start_proxy(upstreams(mocks), client={"reasoning": mode})
    client = proxy.client()
    for model, dialect, text in REASONING_CASES:
        answer = DEFAULT_REPLY.format(dialect=dialect)
        want_content = f"<think>{REASONING}</think>\n\n{answer}" if mode == "think_tags" else answer
        messages = [{"role": "user", "content": text}]
        msg = client.chat.completions.create(model=model, messages=messages).choices[0].message
        extra = msg.model_extra or {}
        assert msg.content == want_content, (model, text)
        assert {k: v for k, v in extra.items() if k in ("reasoning_content", "reasoning")} == \
            ({mode: REASONING} if mode in ("reasoning_content", "reasoning") else {}), (model, text)
        acc = collect(client.chat.completions.create(model=model, messages=messages, stream=True))
        assert acc["content"] == want_content, (model, text)
        for field in ("reasoning_content", "reasoning"):
            assert acc[field] == (REASONING if field == mode else ""), (model, text, field)
        assert acc["roles"] == ["assistant"]


def test_usage_fields_deepseek_for_every_upstream_dialect(mocks, start_proxy) -> None:
    proxy = start_proxy(upstreams(mocks), client={"usage_fields": "deepseek"})
    client = proxy.client()
    messages = [{"role": "system", "content": "Context. " * 100}, {"role": "user", "content": "Hi"}]
    for model in ("qwen-npu", "deepseek-chat", "engine-7b"):
        for stream in (False, True):
            if stream:
                chunks = collect(client.chat.completions.create(
                    model=model, messages=messages, stream=True, stream_options={"include_usage": True}))["chunks"]
                usage = chunks[-1].usage
            else:
                usage = client.chat.completions.create(model=model, messages=messages).usage
            extra = usage.model_extra or {}
            hit = extra["prompt_cache_hit_tokens"]
            assert hit + extra["prompt_cache_miss_tokens"] == usage.prompt_tokens, model
            assert (hit > 0) == (model == "deepseek-chat"), model
            if hit:
                assert usage.prompt_tokens_details.cached_tokens == hit


@pytest.mark.parametrize(("method", "path", "meant"), [
    ("POST", "/chat/completions", "/v1/chat/completions"),  # an OpenAI client's base URL without /v1
    ("POST", "/responses", "/v1/responses"),
    ("GET", "/models", "/v1/models"),
    ("POST", "/v1/v1/messages", "/v1/messages"),  # the Anthropic SDK's base URL with /v1
    ("POST", "/v1/chat/completion", None),  # no route near it: no guess
    ("POST", "/models", None),  # /v1/models takes GET only: not what a POST meant
])
def test_a_path_without_its_v1_prefix_names_the_route_it_meant(mocks, start_proxy, method: str, path: str,
                                                                 meant: str | None) -> None:
    proxy = start_proxy(upstreams(mocks))
    got = httpx.request(method, proxy.url + path, json={"model": "qwen-npu", "messages": []}, timeout=10)
    assert got.status_code == 404 and got.json()["error"]["code"] == "not_found"
    message = got.json()["error"]["message"]
    assert message.startswith(f"No route for {method} {path}.")
    if meant is None:
        assert "Did you mean" not in message, message
    else:
        assert f"Did you mean {meant}?" in message and "base URL" in message, message
