"""MemoryStore: the embedded state store, in this process's memory.

Bounded three ways (docs/decisions.md "Client dialects and state"): at most `max_entries` entries, at most `max_bytes`
bytes (value + namespace + key, UTF-8), each entry for `ttl` seconds (a put's own ttl overrides). When a bound is hit
the oldest entries (by time of their last put) go first. An expired entry is never returned. Every operation is O(1)
amortised: one OrderedDict in put order; expired entries are dropped lazily (on get) and from the old end on every
put, so no background task is needed.

Per process: with `--workers N` or several replicas each process has its own store, and a follow-up request that
lands on another process finds nothing. Use the Redis store (proxy/state/redis.py) there.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from proxy.state.base import ValueTooLarge, check_namespace

DEFAULT_MAX_ENTRIES = 10_000
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
DEFAULT_TTL = 24 * 3600.0


class _Entry(NamedTuple):
    value: bytes
    expires: float
    size: int


class MemoryStore:
    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, max_bytes: int = DEFAULT_MAX_BYTES,
                 ttl: float = DEFAULT_TTL, *, clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries <= 0 or max_bytes <= 0 or ttl <= 0:
            raise ValueError("max_entries, max_bytes and ttl must be greater than 0")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl = ttl
        self._clock = clock
        self._data: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._data)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def describe(self) -> str:
        return "memory"

    async def ping(self) -> None:
        return None

    async def get(self, namespace: str, key: str) -> bytes | None:
        check_namespace(namespace)
        entry = self._data.get((namespace, key))
        if entry is None:
            return None
        if entry.expires <= self._clock():
            self._remove((namespace, key))
            return None
        return entry.value

    async def put(self, namespace: str, key: str, value: bytes, ttl: float | None = None) -> None:
        check_namespace(namespace)
        if ttl is not None and ttl <= 0:
            raise ValueError("ttl must be greater than 0")
        value = bytes(value)
        size = len(value) + len(namespace.encode()) + len(key.encode())
        if size > self.max_bytes:
            raise ValueTooLarge(size, self.max_bytes)
        now = self._clock()
        ident = (namespace, key)
        if ident in self._data:
            self._remove(ident)
        self._drop_expired(now)
        while self._data and (len(self._data) >= self.max_entries or self._bytes + size > self.max_bytes):
            self._remove(next(iter(self._data)))
        self._data[ident] = _Entry(value, now + (self.ttl if ttl is None else ttl), size)
        self._bytes += size

    async def delete(self, namespace: str, key: str) -> bool:
        check_namespace(namespace)
        ident = (namespace, key)
        entry = self._data.get(ident)
        if entry is None:
            return False
        self._remove(ident)
        return entry.expires > self._clock()

    async def close(self) -> None:
        self._data.clear()
        self._bytes = 0

    def _remove(self, ident: tuple[str, str]) -> None:
        self._bytes -= self._data.pop(ident).size

    def _drop_expired(self, now: float) -> None:
        # Entries sit in put order; with one TTL for all that is also expiry order, so the expired ones are at the
        # old end. (An entry put with a shorter own ttl further in is dropped when read, or when it reaches the end.)
        while self._data:
            ident, entry = next(iter(self._data.items()))
            if entry.expires > now:
                return
            self._remove(ident)
