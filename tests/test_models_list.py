"""/v1/models is never empty: an upstream without a model listing (the engine API) shows its configured names, or
its own name, which routes to it."""

from __future__ import annotations

import pytest

from tests.conftest import free_port


def test_engine_upstream_lists_its_name_and_the_name_routes(start_mock, start_proxy) -> None:
    mock = start_mock("engine")
    proxy = start_proxy(mock=mock)
    listed = [(m.id, m.owned_by) for m in proxy.client().models.list()]
    assert listed == [("mock-engine", "mock-engine")]
    answer = proxy.client().chat.completions.create(model="mock-engine",
                                                    messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content and answer.model == "mock-engine"


def test_configured_names_are_listed(start_mock, start_proxy) -> None:
    proxy = start_proxy(mock=start_mock("engine"), models=["chat-a", "chat-b"])
    assert [m.id for m in proxy.client().models.list()] == ["chat-a", "chat-b"]


def test_upstream_that_does_not_answer_still_shows_its_name(start_proxy) -> None:
    proxy = start_proxy([{"name": "far", "dialect": "openai", "url": f"http://127.0.0.1:{free_port()}"}])
    assert [m.id for m in proxy.client().models.list()] == ["far"]


def test_listing_upstream_shows_its_own_models_and_every_listed_name_routes(start_mock, start_proxy) -> None:
    """A DeepSeek upstream serving only V4: its own names, and the retired names, which route as V4 Flash's two
    modes (docs/deepseek.md "Models"). A client that checks its model against the list finds it, and it answers."""
    mock = start_mock("deepseek")
    proxy = start_proxy(mock=mock)
    listed = [m.id for m in proxy.client().models.list()]
    assert listed == ["deepseek-flash", "deepseek-v4-flash", "deepseek-v4-pro", "deepseek-chat", "deepseek-reasoner"]
    for name in listed:
        answer = proxy.client().chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}])
        assert answer.choices[0].message.content and answer.model == name


def test_an_upstream_serving_the_retired_names_lists_them(start_mock, start_proxy) -> None:
    proxy = start_proxy(mock=start_mock("deepseek", flavour="legacy"))
    assert [m.id for m in proxy.client().models.list()] == ["deepseek-chat", "deepseek-reasoner"]


@pytest.mark.parametrize("dialect", ["mindie", "openai"])
def test_default_route_with_aliases_lists_the_aliases_and_the_upstreams_own_names(start_mock, start_proxy,
                                                                                   dialect: str) -> None:
    """A `"*"` route with aliases: both the aliases and the names the upstream lists itself route, so both are
    listed; the upstream's list is read once and cached."""
    mock = start_mock(dialect, served_model="served-7b")
    proxy = start_proxy(mock=mock, aliases={"gpt-4o": "served-7b"}, health_url=mock.url + "/health")
    listed = [(m.id, m.owned_by) for m in proxy.client().models.list()]
    assert listed == [("gpt-4o", f"mock-{dialect}"), ("served-7b", f"mock-{dialect}")]
    for name, _ in listed:
        answer = proxy.client().chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}])
        assert answer.choices[0].message.content
    assert [m.id for m in proxy.client().models.list()] == ["gpt-4o", "served-7b"]
    assert mock.stats()["model_lists"] == 1


def test_only_the_default_route_lists_its_upstreams_names(start_mock, start_proxy) -> None:
    """Names route to the first `"*"` upstream only: a second one's own list would name models that never reach it,
    so it contributes its configured names and aliases only."""
    first, second = start_mock("mindie", served_model="first-model"), start_mock("openai", served_model="second")
    proxy = start_proxy([{"name": "a", "dialect": "mindie", "url": first.url},
                         {"name": "b", "dialect": "openai", "url": second.url, "aliases": {"fast": "second"}}])
    assert [(m.id, m.owned_by) for m in proxy.client().models.list()] == [("fast", "b"), ("first-model", "a")]
