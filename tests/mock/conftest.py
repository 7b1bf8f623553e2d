"""Fixtures for the mock upstream tests: real uvicorn servers on 127.0.0.1, shared per test session."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from mockutil import MockServer


@pytest.fixture(scope="session")
def mock_servers() -> Iterator[Callable[..., MockServer]]:
    """mock_servers(dialect, **options) -> a running MockServer, started once per distinct configuration."""
    cache: dict[tuple[Any, ...], MockServer] = {}

    def get(dialect: str, **options: Any) -> MockServer:
        key = (dialect, *sorted(options.items()))
        if key not in cache:
            cache[key] = MockServer(dialect, **options)
        srv = cache[key]
        srv.reset()
        return srv

    yield get
    for srv in cache.values():
        srv.stop()
