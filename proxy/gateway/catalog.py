"""An upstream's own model list (`GET` on its dialect's models path), read once and kept: `/v1/models` lists it for the
default route, and a dialect whose translation depends on what the upstream serves reads it (the DeepSeek spoke:
a retired name the upstream still lists goes through unchanged, docs/deepseek.md "Models").

One `ModelCatalog` per upstream and process. The first caller that needs the list waits for one read (bounded by
twice `readiness_timeout`, as the readiness probe); concurrent callers share that read. The list is then kept for
`TTL` seconds; after that the kept list is still answered at once while one background read renews it. A read that
fails (refused, timed out, not 200, not a list) keeps the list read before, if any, and is not tried again for
`RETRY` seconds, so a dead or listless upstream costs no request a wait after the first. An upstream whose dialect
has no models path (the engine API) has no list: `None`, without any read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import orjson

from proxy.errors import ProxyError
from proxy.gateway.redact import redact_urls
from proxy.gateway.upstream import read_body

if TYPE_CHECKING:
    from proxy.dialects.base import Dialect
    from proxy.gateway.replicas import ReplicaSet
    from proxy.settings import UpstreamSettings

log: Final = logging.getLogger("dialect_proxy")

TTL: Final = 300.0  # seconds a read list is answered without renewing it
RETRY: Final = 30.0  # seconds before a failed read is tried again
MAX_BYTES: Final = 2**20


class ModelCatalog:
    """The model ids one upstream lists, cached (see the module docstring)."""

    def __init__(self, upstream: UpstreamSettings, replicas: ReplicaSet, dialect: Dialect, timeout: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.upstream = upstream
        self._replicas = replicas
        self._dialect = dialect
        self._path = dialect.path("models")
        self._timeout = timeout
        self._clock = clock
        self._names: tuple[str, ...] | None = None
        self._lookup: frozenset[str] = frozenset()
        self._next_read = 0.0  # clock time from which a read is due (the list is stale, or the last read failed)
        self._read: asyncio.Task[None] | None = None
        self.reads = 0  # upstream reads started (for tests and logs)

    def known(self) -> tuple[str, ...] | None:
        """The list as last read, without waiting for anything; None when it was never read (or cannot be)."""
        return self._names

    def lists(self, name: str) -> bool:
        """Whether the upstream's list, as last read, has `name` (False when there is no list)."""
        return name in self._lookup

    async def names(self) -> tuple[str, ...] | None:
        """The upstream's model ids: the kept list (renewed in the background once stale), or the result of the
        first read; None when the upstream has no list or it could not be read."""
        if self._path is None:
            return None
        if self._clock() >= self._next_read and self._read is None:
            self.reads += 1
            self._read = asyncio.get_running_loop().create_task(self._refresh())
        if self._names is None and self._read is not None:
            # The first read: wait for it (shielded: a client that leaves does not cancel it for the others).
            await asyncio.shield(self._read)
        return self._names

    async def _refresh(self) -> None:
        try:
            names = await self._fetch()
        except Exception as exc:  # whatever the upstream sent: no list this time, never a failed request
            log.warning("upstream %s: reading its model list failed: %s", self.upstream.name, redact_urls(repr(exc)))
            names = None
        finally:
            self._read = None
        if names is None:
            self._next_read = self._clock() + RETRY
            return
        self._names = names
        self._lookup = frozenset(names)
        self._next_read = self._clock() + TTL

    async def _fetch(self) -> tuple[str, ...] | None:
        assert self._path is not None
        headers = {"Authorization": f"Bearer {self.upstream.api_key}"} if self.upstream.api_key else {}
        replica = self._replicas.any_replica()
        try:
            resp = await replica.client.open("GET", replica.url + self._path, headers=headers, timeout=self._timeout)
            try:
                raw = await read_body(resp, self._timeout, limit=MAX_BYTES)
            finally:
                resp.close()
            if resp.status != 200:
                log.info("upstream %s: its model list answered HTTP %d", self.upstream.name, resp.status)
                return None
            cards = self._dialect.decode_models(orjson.loads(raw))
        except (ProxyError, orjson.JSONDecodeError) as exc:
            log.info("upstream %s: its model list could not be read: %s", self.upstream.name, redact_urls(str(exc)))
            return None
        return tuple(dict.fromkeys(card["id"] for card in cards))

    async def close(self) -> None:
        task, self._read = self._read, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
