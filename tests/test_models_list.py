"""/v1/models is never empty: an upstream without a model listing (the engine API) shows its configured names, or
its own name, which routes to it."""

from __future__ import annotations

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


def test_listing_upstream_shows_its_own_models(start_mock, start_proxy) -> None:
    proxy = start_proxy(mock=start_mock("deepseek"))
    assert [m.id for m in proxy.client().models.list()] == ["deepseek-flash", "deepseek-v4-flash", "deepseek-v4-pro"]
