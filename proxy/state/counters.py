"""The counters behind per-key limits (proxy/gateway/limits.py): one admission asks for everything at once
(`Counters.admit`, a `LimitAsk`), and its end gives back what the reservation did not use (`Counters.settle`).

The algorithm (docs/decisions.md "Per-key limits (issue 47)"): each key has a log of its admissions in the
last window (`window` seconds, 60 for the "per minute" limits), each entry with the tokens it holds. A request is
admitted when the log holds fewer than `requests_per_minute` entries and its tokens plus the request's reservation
stay within `tokens_per_minute`; settling rewrites the entry with the tokens really used. So in any window the key's
usage exceeds its limit by at most what a request used beyond its reservation. Concurrency is a set of leases (each
with an expiry, so that a lost process cannot hold a slot for ever); the day and month quotas are counters under
the UTC date.

`MemoryCounters` is this process's; proxy/state/counters_redis.py does the same in one Lua script per call, shared
by every process that points at the Redis.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from proxy.errors import ProxyError


class CountersUnavailable(ProxyError):
    """The shared counters did not answer in time (the limiter then fails open or closed: proxy/gateway/limits.py)."""

    def __init__(self, detail: str) -> None:
        super().__init__("The rate limiter's store cannot be reached.", 503, type="service_unavailable",
                         code="limits_unavailable")
        self.detail = detail


@dataclass(slots=True)
class LimitAsk:
    """One admission's ask of one key's counters; a limit of 0 is none."""

    key: str  # the key's name
    lease: str  # this request's own id (its log entry and its concurrency lease)
    cost: int  # the tokens reserved
    requests_per_minute: int
    tokens_per_minute: int
    max_concurrent: int
    tokens_per_day: int
    tokens_per_month: int
    day: str  # the UTC day and month the quotas count in: "2026-11-27", "2026-11"
    month: str
    window: float  # seconds: the "minute" of the per-minute limits
    lease_ttl: float  # seconds a concurrency lease lives at most (a lost process's expires)

    # Written out (made per keyed request): a generated one runs interpreted even compiled (docs/speed.md).
    def __init__(self, key: str, lease: str, cost: int, requests_per_minute: int, tokens_per_minute: int,
                 max_concurrent: int, tokens_per_day: int, tokens_per_month: int, day: str, month: str, window: float,
                 lease_ttl: float) -> None:
        self.key = key
        self.lease = lease
        self.cost = cost
        self.requests_per_minute = requests_per_minute
        self.tokens_per_minute = tokens_per_minute
        self.max_concurrent = max_concurrent
        self.tokens_per_day = tokens_per_day
        self.tokens_per_month = tokens_per_month
        self.day = day
        self.month = month
        self.window = window
        self.lease_ttl = lease_ttl


@dataclass(slots=True)
class Verdict:
    """The counters' answer. `reason` (when refused): requests, tokens, concurrent, day, month, or too_large (the
    reservation alone is over tokens_per_minute). The counts include this request when it was admitted."""

    allowed: bool
    reason: str
    retry_after: float  # seconds until the refused request would fit
    requests: int  # entries in the window
    tokens: int  # tokens in the window
    reset: float  # seconds until the window is empty again
    day_used: int
    month_used: int

    # Written out (made per keyed request): a generated one runs interpreted even compiled (docs/speed.md).
    def __init__(self, allowed: bool, reason: str, retry_after: float, requests: int, tokens: int, reset: float,
                 day_used: int, month_used: int) -> None:
        self.allowed = allowed
        self.reason = reason
        self.retry_after = retry_after
        self.requests = requests
        self.tokens = tokens
        self.reset = reset
        self.day_used = day_used
        self.month_used = month_used


class Counters(Protocol):
    async def admit(self, ask: LimitAsk) -> Verdict: ...

    async def settle(self, ask: LimitAsk, used: int) -> None:
        """The request is over and used `used` tokens: its entry and quotas say so, its lease is given back."""

    async def usage(self, key: str, day: str, month: str) -> tuple[int, int]:
        """The key's tokens counted for `day` and `month`."""


def refusal(ask: LimitAsk, requests: int, tokens: int, running: int, quota: tuple[int, int]) -> str:
    """Which limit the ask is over (first the quotas, which waiting does not cure), "" for none."""
    day, month = quota
    if ask.tokens_per_month and month + ask.cost > ask.tokens_per_month:
        return "month"
    if ask.tokens_per_day and day + ask.cost > ask.tokens_per_day:
        return "day"
    if ask.tokens_per_minute and ask.cost > ask.tokens_per_minute:
        return "too_large"
    if ask.max_concurrent and running >= ask.max_concurrent:
        return "concurrent"
    if ask.requests_per_minute and requests >= ask.requests_per_minute:
        return "requests"
    if ask.tokens_per_minute and tokens + ask.cost > ask.tokens_per_minute:
        return "tokens"
    return ""


class _Log:
    """One key's window: its entries [time, lease, tokens], oldest first, and their tokens' sum."""

    __slots__ = ("by_lease", "entries", "tokens")

    def __init__(self) -> None:
        self.entries: deque[list[float | str | int]] = deque()
        self.by_lease: dict[str, list[float | str | int]] = {}
        self.tokens = 0

    def trim(self, before: float) -> None:
        entries = self.entries
        while entries and float(entries[0][0]) <= before:
            entry = entries.popleft()
            del self.by_lease[str(entry[1])]
            self.tokens -= int(entry[2])


class MemoryCounters:
    """This process's counters (no Redis, or the fail-open fallback)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._logs: dict[str, _Log] = {}
        self._leases: dict[str, dict[str, float]] = {}
        self._quota: dict[str, _Quota] = {}  # each key's current day and month

    async def admit(self, ask: LimitAsk) -> Verdict:
        now = self._clock()
        log = self._logs.setdefault(ask.key, _Log())
        log.trim(now - ask.window)
        leases = self._leases.setdefault(ask.key, {})
        for lease in [lease for lease, expiry in leases.items() if expiry <= now]:
            del leases[lease]
        counted = self._quota.get(ask.key)
        if counted is None or counted.day != ask.day or counted.month != ask.month:
            counted = self._quota[ask.key] = _Quota(ask.day, ask.month, counted)
        quota = (counted.day_used, counted.month_used)
        reason = refusal(ask, len(log.entries), log.tokens, len(leases), quota)
        if reason:
            return Verdict(False, reason, _retry_after(reason, ask, log, now), len(log.entries), log.tokens,
                           _reset(log, ask.window, now), *quota)
        entry: list[float | str | int] = [now, ask.lease, ask.cost]
        log.entries.append(entry)
        log.by_lease[ask.lease] = entry
        log.tokens += ask.cost
        if ask.max_concurrent:
            leases[ask.lease] = now + ask.lease_ttl
        counted.add(ask.day, ask.month, ask.cost)
        return Verdict(True, "", 0.0, len(log.entries), log.tokens, ask.window, quota[0] + ask.cost,
                       quota[1] + ask.cost)

    async def settle(self, ask: LimitAsk, used: int) -> None:
        self._leases.get(ask.key, {}).pop(ask.lease, None)
        delta = used - ask.cost
        if not delta:
            return
        log = self._logs.get(ask.key)
        entry = None if log is None else log.by_lease.get(ask.lease)
        if log is not None and entry is not None:
            entry[2] = used
            log.tokens += delta
        counted = self._quota.get(ask.key)
        if counted is not None:
            counted.add(ask.day, ask.month, delta)

    async def usage(self, key: str, day: str, month: str) -> tuple[int, int]:
        counted = self._quota.get(key)
        if counted is None:
            return 0, 0
        return counted.day_used if counted.day == day else 0, counted.month_used if counted.month == month else 0


class _Quota:
    """One key's tokens in its current UTC day and month (an older day or month is forgotten)."""

    __slots__ = ("day", "day_used", "month", "month_used")

    def __init__(self, day: str, month: str, before: _Quota | None) -> None:
        self.day = day
        self.month = month
        self.day_used: int = before.day_used if before is not None and before.day == day else 0
        self.month_used: int = before.month_used if before is not None and before.month == month else 0

    def add(self, day: str, month: str, tokens: int) -> None:
        if day == self.day:
            self.day_used += tokens
        if month == self.month:
            self.month_used += tokens


def _retry_after(reason: str, ask: LimitAsk, log: _Log, now: float) -> float:
    """Seconds until enough of the window's entries leave it for the ask to fit (1 s for a concurrency slot, which
    frees when some request ends)."""
    if reason == "requests":
        entry = log.entries[len(log.entries) - ask.requests_per_minute]
        return max(0.001, float(entry[0]) + ask.window - now)
    if reason == "tokens":
        need = log.tokens + ask.cost - ask.tokens_per_minute
        for entry in log.entries:
            need -= int(entry[2])
            if need <= 0:
                return max(0.001, float(entry[0]) + ask.window - now)
    if reason == "concurrent":
        return 1.0
    return ask.window


def _reset(log: _Log, window: float, now: float) -> float:
    return max(0.0, float(log.entries[-1][0]) + window - now) if log.entries else 0.0


def whole_seconds(seconds: float) -> int:
    """A Retry-After value: whole seconds, never 0 for a wait that is not over."""
    return max(1, math.ceil(seconds))
