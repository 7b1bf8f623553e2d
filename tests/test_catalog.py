"""proxy/gateway/catalog.py against a real mock upstream, with the catalog's clock in the test's hands: one read, kept
for TTL seconds, then answered at once while one background read renews it; a failed read is not repeated before
RETRY seconds; an upstream without a models path is never asked."""

from __future__ import annotations

import asyncio
from typing import Any

from proxy.gateway.catalog import RETRY, TTL, ModelCatalog
from proxy.server.appstate import AppState
from proxy.settings import build_settings
from tests.conftest import free_port


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def catalog_for(upstream: dict[str, Any], clock: Clock) -> tuple[AppState, ModelCatalog]:
    state = AppState(build_settings(config={"upstreams": [upstream]}, environ={}))
    name = upstream["name"]
    return state, ModelCatalog(state.settings.upstreams[0], state.replicas[name], state.dialects[name], 2.0, clock)


def test_one_read_kept_then_renewed_in_the_background(start_mock) -> None:
    mock = start_mock("deepseek", flavour="legacy")
    clock = Clock()

    async def go() -> None:
        state, catalog = catalog_for({"name": "ds", "dialect": "deepseek", "url": mock.url}, clock)
        try:
            assert catalog.known() is None and not catalog.lists("deepseek-chat")
            first = await asyncio.gather(*(catalog.names() for _ in range(5)))
            assert first == [("deepseek-chat", "deepseek-reasoner")] * 5 and catalog.reads == 1
            assert catalog.lists("deepseek-reasoner") and not catalog.lists("deepseek-flash")
            clock.now += TTL - 1
            assert await catalog.names() == ("deepseek-chat", "deepseek-reasoner") and catalog.reads == 1
            clock.now += 2  # stale: the kept list answers at once, one read renews it
            assert await catalog.names() == ("deepseek-chat", "deepseek-reasoner") and catalog.reads == 2
            for _ in range(50):  # bounded: the background read of a loopback mock
                if catalog.known() is not None and catalog._read is None:
                    break
                await asyncio.sleep(0.02)
            assert await catalog.names() == ("deepseek-chat", "deepseek-reasoner") and catalog.reads == 2
        finally:
            await catalog.close()
            await state.close()

    asyncio.run(go())
    assert mock.stats()["model_lists"] == 2


def test_a_failed_read_is_retried_only_after_a_while() -> None:
    clock = Clock()

    async def go() -> None:
        url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        state, catalog = catalog_for({"name": "ds", "dialect": "deepseek", "url": url}, clock)
        try:
            assert await catalog.names() is None and catalog.reads == 1
            assert await catalog.names() is None and catalog.reads == 1
            clock.now += RETRY + 1
            assert await catalog.names() is None and catalog.reads == 2
        finally:
            await catalog.close()
            await state.close()

    asyncio.run(go())


def test_an_upstream_without_a_model_list_is_never_asked(start_mock) -> None:
    mock = start_mock("engine")

    async def go() -> None:
        state, catalog = catalog_for({"name": "e", "dialect": "engine", "url": mock.url}, Clock())
        try:
            assert await catalog.names() is None and catalog.reads == 0
        finally:
            await state.close()

    asyncio.run(go())
