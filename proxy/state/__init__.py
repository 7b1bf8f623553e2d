"""State stores (proxy/state/base.py). Interim: a plain in-process dict until the bounded stores land."""

from __future__ import annotations

from ..settings import Settings
from .base import StateStore, StoreUnavailable


class _DictStore:
    def __init__(self) -> None:
        self._data: dict[tuple[str, str], bytes] = {}

    async def get(self, namespace: str, key: str) -> bytes | None:
        return self._data.get((namespace, key))

    async def put(self, namespace: str, key: str, value: bytes, ttl: float | None = None) -> None:
        self._data[(namespace, key)] = value

    async def delete(self, namespace: str, key: str) -> bool:
        return self._data.pop((namespace, key), None) is not None

    async def close(self) -> None:
        pass


def open_store(settings: Settings) -> StateStore:
    return _DictStore()


__all__ = ["StateStore", "StoreUnavailable", "open_store"]
