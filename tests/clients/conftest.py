"""Fixtures the client-spoke end-to-end tests share."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import Mock, Proxy


@pytest.fixture
def stack(start_mock: Callable[..., Mock], start_proxy: Callable[..., Proxy]) -> Callable[..., tuple[Mock, Proxy]]:
    """start("mindie+full_text") -> a mock of that dialect (full text when `+...`) and the proxy in front of it."""
    def start(dialect: str = "openai") -> tuple[Mock, Proxy]:
        name, _, mode = dialect.partition("+")
        mock = start_mock(name, full_text=bool(mode))
        return mock, start_proxy(mock=mock, **({"full_text": True} if mode else {}))
    return start
